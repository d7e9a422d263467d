"""A what-if from the quota page in a real browser: an org admin copies the live tree into a draft, moves
guarantee between two teams in the draft's editor, runs the replay over the last days' jobs, watches the
progress bar give way to the answer, and reads the per-unit table.

The run's Celery task is executed by a thread of this process that takes queued runs as a worker would
(the browser tests run no Celery worker; the cycle thread stands in for beat the same way)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from scheduling.models import Task
from scheduling.whatif.models import RunState, WhatIfRun
from scheduling.whatif.services import whatif_run
from tests.browser.conftest import People, screenshot, sign_in
from tests.factories import make_cluster, make_job

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def _history(people: People) -> None:
    """Two days of 8-GPU jobs of team-a and team-b on two nodes: each team waits for the other's."""
    nodes = make_cluster(nodes=2)
    start = timezone.now() - timedelta(days=3)
    for i in range(12):
        submitted = start + timedelta(hours=2 * (i // 2))
        job = make_job(
            team=people.org.team_a if i % 2 else people.org.team_b,
            user=people.ann if i % 2 else people.ben,
            gpus_per_replica=8,
            submitted_at=submitted,
            started_at=submitted,
            ended_at=submitted + timedelta(hours=3),
            state="COMPLETED",
            time_limit_s=4 * 3600,
        )
        Task.objects.create(
            job=job, attempt=1, rank=0, node=nodes[i % 2], started_at=submitted, ended_at=submitted + timedelta(hours=3)
        )


def _worker(stop: threading.Event) -> None:
    from django.db import connection

    try:
        while not stop.wait(0.3):
            for pk in WhatIfRun.objects.filter(state=RunState.QUEUED).values_list("pk", flat=True):
                whatif_run(run_id=pk)
    finally:
        connection.close()


def test_an_org_admin_runs_a_whatif_from_the_quota_page_and_reads_the_table(page: Page, live_server: Any, people: People) -> None:
    _history(people)
    stop = threading.Event()
    worker = threading.Thread(target=_worker, args=(stop,), daemon=True)
    worker.start()
    try:
        sign_in(page, live_server.url, "oli")
        page.goto(f"{live_server.url}/quotas/")
        page.get_by_role("button", name="Copy the live tree into a draft").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("Draft: Draft of Research")
        # Vision's 32: team-a 16 -> 8, team-b 8 -> 16, in the draft's editor (the quota editor's cells).
        a = page.locator(f"#q-{people.org.team_a.pk}-H100")
        a.get_by_label("team-a H100 guaranteed").fill("8")
        a.get_by_role("button", name="Save").click()
        expect(a.get_by_text("Saved")).to_be_visible()
        b = page.locator(f"#q-{people.org.team_b.pk}-H100")
        b.get_by_label("team-b H100 guaranteed").fill("16")
        b.get_by_label("team-b H100 limit").fill("32")
        b.get_by_role("button", name="Save").click()
        expect(b.get_by_text("Saved")).to_be_visible()
        page.reload()
        expect(page.locator(f"#q-{people.org.team_b.pk}-H100").get_by_label("team-b H100 guaranteed")).to_have_value("16")
        expect(page.get_by_text("team-a H100: 16 · 32 · 1 → 8 · 32 · 1")).to_be_visible()  # the changes apply would write
        screenshot(page, "whatif-draft")

        today = timezone.localdate()
        page.locator("#id_start").fill(str(today - timedelta(days=5)))
        page.locator("#id_end").fill(str(today))
        page.get_by_role("button", name="Run the what-if").click()
        expect(page.get_by_role("heading", level=1)).to_contain_text("What-if #")
        table = page.locator("#whatif-units")
        expect(table).to_be_visible(timeout=60_000)  # the progress bar's polling reloads the page once done
        expect(page.locator("#run-state")).to_have_text("Done")
        expect(table.locator("tr[data-unit='team-a']")).to_contain_text("team-a")
        expect(table.locator("tr[data-unit='team-b']")).to_be_visible()
        expect(table).not_to_contain_text("team-c")  # outside Research: not oli's to see
        expect(page.get_by_role("link", name="Download as CSV")).to_be_visible()
        expect(page.get_by_text("recorded run times")).to_be_visible()
        screenshot(page, "whatif")
        # The live tree is untouched until the draft is applied.
        page.goto(f"{live_server.url}/quotas/")
        expect(page.locator(f"#q-{people.org.team_a.pk}-H100").get_by_label("team-a H100 guaranteed")).to_have_value("16")
    finally:
        stop.set()
        worker.join(timeout=30)
