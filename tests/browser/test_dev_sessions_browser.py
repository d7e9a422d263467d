"""A dev session's page in real Chromium: reached from the nav, it says where the session runs, how to
connect (`yard ssh <id>` and the SSH config block), its connections, and counts down to the idle stop."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from playwright.sync_api import Page, expect

from scheduling.governance.reaper import last_complete_window
from scheduling.models import Gpu, JobKind, Task
from tests.browser.conftest import People, screenshot, sign_in
from tests.factories import make_cluster
from tests.governance.helpers import running_job, telemetry

pytestmark = [pytest.mark.browser]

HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJeydCn38sbRTRwmOmdrcmDOENk2ojY+o9EBHo+Chbsn"


def test_the_session_page_says_how_to_connect_and_when_the_idle_reaper_stops_it(page: Page, live_server, people: People):
    make_cluster(nodes=2)
    now = timezone.now()
    node = Gpu.objects.order_by("pk").first().node
    job = running_job(
        team=people.org.team_a, user=people.ann, node=node, gpus=2, start=now - timedelta(hours=1), kind=JobKind.DEV
    )
    Task.objects.filter(job=job).update(
        dev_endpoint="10.0.0.5:20001", dev_host_key=HOST_KEY, dev_connections=1, dev_last_activity=now - timedelta(minutes=2)
    )
    telemetry(job, start=last_complete_window(now) - timedelta(minutes=11), minutes=12, utilization=0.0)  # 12 idle minutes

    sign_in(page, live_server.url, "ann")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Dev sessions", exact=True).click()
    expect(page.get_by_role("heading", name="Dev sessions", exact=True)).to_be_visible()
    expect(page.locator("#no-ssh-keys")).to_contain_text("You have no SSH key yet")
    page.get_by_role("link", name=f"#{job.pk} {job.name}").click()

    expect(page.locator("#job-state")).to_have_text("Running")
    expect(page.locator("#dev-node")).to_have_text(node.name)
    expect(page.locator("#dev-ssh-command")).to_have_text(f"yard ssh {job.pk}")
    expect(page.locator("#dev-ssh-config")).to_have_text(f"yard ssh --config {job.pk} >> ~/.ssh/config")
    expect(page.locator("#dev-host-key")).to_have_text(HOST_KEY)
    expect(page.locator("#dev-connections")).to_have_text("1 SSH connection open")
    expect(page.locator("#dev-activity")).to_contain_text("GPU idle (≤ 1 %) for the last 12 min")
    expect(page.locator("#dev-activity")).to_contain_text("an open SSH connection does not keep it")
    expect(page.get_by_role("button", name="Keep it 60 min longer")).to_be_visible()
    expect(page.get_by_role("link", name="SSH keys").last).to_be_visible()
    screenshot(page, "dev-session")
