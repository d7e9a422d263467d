"""The portal's main flows in a real browser, against real agents on simulated GPUs."""

from __future__ import annotations

import re
import sys

import pytest
from playwright.sync_api import Page, expect

from scheduling.models import Job
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState
from tests.browser.conftest import Cluster, People, screenshot, sign_in
from tests.e2e.conftest import script, wait_for
from tests.factories import make_job

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TRAIN = """
import os, time
util = os.environ.get("YARD_SIM_UTIL_FILE")
print("hello from rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], flush=True)
for step in range(12):
    if util:  # what the simulated GPUs report as this rank's utilisation
        with open(util, "w") as out:
            out.write(str(55 + 3 * step))
    print("step", step, flush=True)
    time.sleep(0.5)
print("rank", os.environ["RANK"], "done", flush=True)
"""
SLEEP = f"exec {sys.executable} -c 'import time; time.sleep(600)'"
POLL_MS = 30_000


def nav(page: Page, name: str) -> None:
    page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).click()


def test_submit_a_two_replica_job_and_follow_it_to_completed_with_its_log(
    page: Page, live_server, cluster: Cluster, people: People
):
    # Another team's small job, so the map shows two teams and a partly used node.
    job_submit(user=people.ben, spec=JobSpec(name="eval", team=people.org.team_b, gpus_per_replica=3, command=SLEEP))
    wait_for("team-b's job running", lambda: Job.objects.filter(state=JobState.RUNNING).exists(), timeout=60)
    cluster.scheduling.clear()  # hold the cycle until the page has shown the job waiting
    sign_in(page, live_server.url, "ann")
    nav(page, "Submit")
    page.get_by_label("Name:", exact=True).fill("two-ranks")
    page.get_by_label("Replicas:", exact=True).fill("2")
    page.get_by_label("GPUs per replica:", exact=True).fill("4")
    page.get_by_label("Command:", exact=True).fill(script(cluster.root, "train", TRAIN))
    expect(page.locator("#preview .verdict.ok")).to_contain_text("fits now")
    screenshot(page, "submit")
    page.get_by_role("button", name="Submit job").click()

    expect(page.locator("#job-state")).to_have_text("Pending")
    cluster.scheduling.set()
    expect(page.locator("#job-state")).to_have_text("Running", timeout=POLL_MS)
    expect(page.get_by_text("2 of 2 ranks running")).to_be_visible(timeout=POLL_MS)
    expect(page.locator("#log")).to_contain_text("hello from rank 0", timeout=POLL_MS)
    screenshot(page, "job")
    nav(page, "Dashboard")
    expect(page.get_by_text("two-ranks")).to_be_visible()
    screenshot(page, "dashboard")
    nav(page, "Cluster")
    expect(page.locator(".gpu.busy").first).to_be_visible()
    screenshot(page, "cluster")

    page.go_back()
    page.go_back()
    expect(page.locator("#job-state")).to_have_text("Completed", timeout=POLL_MS)
    expect(page.locator("#log")).to_contain_text("rank 0 done")
    expect(page.locator(".timeline")).to_contain_text("RUNNING")
    nav(page, "Jobs")
    expect(page.locator("#results")).to_contain_text("two-ranks")
    screenshot(page, "jobs")


def test_launch_a_notebook_open_it_and_stop_it(page: Page, live_server, cluster: Cluster, people: People):
    sign_in(page, live_server.url, "ann")
    nav(page, "Notebooks")
    page.get_by_label("GPUs:", exact=True).fill("1")
    page.get_by_role("button", name="Launch notebook").click()
    expect(page.locator("#open-notebook")).to_be_visible(timeout=60_000)
    screenshot(page, "notebook")

    with page.context.expect_page() as opened:
        page.locator("#open-notebook").click()
    jupyter = opened.value
    # The portal's link leads to its notebook proxy, never to the node, and carries no token
    # (tests/browser/test_notebook_proxy.py runs a kernel through it).
    jupyter.wait_for_url(re.compile(r"/notebooks/\d+/lab/"), timeout=POLL_MS)
    assert "token" not in jupyter.url
    jupyter.close()

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop notebook").click()
    expect(page.locator("#job-state")).to_have_text("Stopped", timeout=POLL_MS)  # a notebook stops; a job is cancelled
    expect(page.locator("#open-notebook")).to_have_count(0)


def test_cancel_a_running_job(page: Page, live_server, cluster: Cluster, people: People):
    job = job_submit(
        user=people.ann,
        spec=JobSpec(name="long-one", team=people.org.team_a, command=SLEEP),
    )
    wait_for("job running", lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, timeout=60)
    sign_in(page, live_server.url, "ann")
    page.goto(f"{live_server.url}/jobs/{job.pk}/")
    expect(page.locator("#job-state")).to_have_text("Running")

    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel job").click()

    expect(page.locator("#job-state")).to_have_text("Cancelled", timeout=POLL_MS)
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_org_admin_sees_an_invalid_quota_edit_refused_and_a_valid_one_in_the_history(page: Page, live_server, people: People):
    sign_in(page, live_server.url, "oli")
    nav(page, "Quotas")
    cell = page.locator(f"#q-{people.org.team_a.pk}-H100")

    cell.get_by_label("team-a H100 guaranteed").fill("30")
    cell.get_by_role("button", name="Save").click()
    expect(cell.locator(".error")).to_contain_text("Vision's children would hold 38 H100 of its 32")

    cell.get_by_label("team-a H100 guaranteed").fill("20")
    cell.get_by_role("button", name="Save").click()
    expect(cell.get_by_text("Saved")).to_be_visible()
    expect(page.locator("#history")).to_contain_text("team-a H100: guaranteed 16 → 20")
    screenshot(page, "quotas")


def test_a_team_a_member_cannot_open_a_team_b_job(page: Page, live_server, people: People):
    job = make_job(team=people.org.team_b, user=people.ben, name="team-b-private")
    sign_in(page, live_server.url, "ann")
    response = page.goto(f"{live_server.url}/jobs/{job.pk}/")
    assert response is not None and response.status == 404
    assert "team-b-private" not in page.content()
