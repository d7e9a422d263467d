"""In Debian's Chromium: the report page's CSV download parses and its totals equal the page's."""

from __future__ import annotations

import csv
import io
import os
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tenants.models import Role
from tests.factories import make_cluster, make_job, make_org, make_user
from tests.governance.helpers import attempt

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not Path(CHROMIUM).exists() and not shutil.which("chromium"), reason="Debian's chromium is not installed"),
]
# Playwright's sync API runs an event loop in this thread; the test's own ORM calls are plain sync code.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

COLUMNS = [
    "guaranteed_gpu_hours",
    "used_gpu_hours",
    "borrowed_gpu_hours",
    "lost_to_preemption_gpu_hours",
    "idle_reaped_gpu_hours",
]


def at(day: int, hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 10, day, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def admin_session(client, transactional_db):
    org = make_org()
    nodes = make_cluster(nodes=2)
    ada = make_user("ada", unit=org.team_a)
    carl = make_user("carl", unit=org.team_c)
    for i, (team, who, hours) in enumerate([(org.team_a, ada, 5), (org.team_b, ada, 2), (org.team_c, carl, 9)]):
        job = make_job(team=team, user=who, name=f"job-{i}")
        attempt(
            job,
            node=nodes[i % 2],
            number=1,
            gpus=[i, i + 3],
            start=at(2 + i, 1),
            end=at(2 + i, 1 + hours, 17, 9),
            borrowed=i == 2,
        )
    admin = make_user("root", unit=org.root, role=Role.CLUSTER_ADMIN)
    client.force_login(admin)
    return client.cookies["sessionid"].value, org


def test_downloaded_csv_parses_and_its_totals_equal_the_page(live_server, admin_session, browser, tmp_path):
    # pytest-playwright's session browser (launched as tests/conftest.py says): one Playwright per run,
    # since a second sync Playwright in the same process refuses to start inside the first one's loop.
    session_id, org = admin_session
    context = browser.new_context(accept_downloads=True)
    try:
        context.add_cookies([{"name": "sessionid", "value": session_id, "url": live_server.url}])
        page = context.new_page()
        page.goto(f"{live_server.url}/reports/?month=2026-10")
        page_totals = {
            column: float(page.get_attribute(f'#report-totals td[data-column="{column}"]', "data-value") or "nan")
            for column in COLUMNS
        }
        with page.expect_download() as info:
            page.click("#csv-units")
        path = tmp_path / "usage.csv"
        info.value.save_as(path)
    finally:
        context.close()
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    assert rows and rows[0].keys() >= {"month", "unit", "gpu_type", *COLUMNS}
    top = [r for r in rows if r["unit_id"] == str(org.root.pk)]
    csv_totals = {column: sum(float(r[column]) for r in top) for column in COLUMNS}
    assert csv_totals == pytest.approx(page_totals, abs=1e-3)
    assert page_totals["used_gpu_hours"] == pytest.approx(2 * (5 + 2 + 9) + 3 * 2 * 17 / 60 + 3 * 2 * 9 / 3600, abs=1e-3)
