"""One definition of "borrowed", everywhere: the GPUs a team holds beyond its guarantee, max(0, used - guaranteed).

The issue's case: `yard quota` and `GET /api/v1/me/quota` said 192 borrowed while the quota page said 97 at
the same moment, because the API counted every GPU of a job flagged borrowed. The scheduler flags a whole
job that runs even partly beyond the guarantee (a gang is reclaimed whole), so that count is what a reclaim
could take (``reclaimable``), not what the team borrows. One state, and every figure a person reads of it:
the API's JSON, the real `yard quota` against a live server, the quota page, the dashboard, /metrics and
the monthly usage report (GPU-hours beyond the guarantee) all say the same.
"""

from __future__ import annotations

import csv
import io
import os
import re
import subprocess
from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from scheduling.models import Allocation, Job, Task
from scheduling.states import JobState, TaskState
from tenants.models import Role
from tenants.services import token_create_personal
from tests.api.conftest import token_client
from tests.cli.conftest import yard_executable
from tests.factories import make_cluster, make_job, make_org, make_user
from tests.governance.helpers import running_job

METRICS_TOKEN = "metrics-token-for-tests-0123456789"
GUARANTEED, HELD, BORROWED, RECLAIMABLE = 8, 12, 4, 8


@pytest.fixture
def state(transactional_db: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """team-b (8 H100 guaranteed, limit 16) holds 12 GPUs: a 4-GPU job within the guarantee, and a 2x4 gang
    the scheduler flagged borrowed (it runs partly beyond the guarantee). It borrows 4; 8 are reclaimable."""
    cache.clear()
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "100000/minute"}}
    monkeypatch.setenv("YARD_METRICS_TOKEN", METRICS_TOKEN)
    org = make_org()
    nodes = make_cluster(nodes=4)
    ben = make_user("ben", unit=org.team_b)
    start = timezone.now() - timedelta(hours=2)
    running_job(team=org.team_b, user=ben, node=nodes[0], gpus=4, start=start, name="within", tier=2)
    gang = make_job(
        team=org.team_b, user=ben, name="gang", tier=2, replicas=2, gpus_per_replica=4, state=JobState.RUNNING,
        started_at=start, submitted_at=start, borrowed=True,
    )  # fmt: skip
    for rank, node in enumerate(nodes[1:3]):
        task = Task.objects.create(job=gang, attempt=1, rank=rank, node=node, state=TaskState.RUNNING, started_at=start)
        for gpu in node.gpus.order_by("index")[:4]:
            Allocation.objects.create(gpu=gpu, task=task, job=gang, attempt=1, allocated_at=start, borrowed=True)
    assert Allocation.objects.filter(job__team=org.team_b, released_at__isnull=True).count() == HELD
    # The old count (every GPU of a borrowing job) and the honest one differ in this state.
    assert Allocation.objects.filter(job__team=org.team_b, released_at__isnull=True, job__borrowed=True).count() == RECLAIMABLE
    assert max(HELD - GUARANTEED, 0) == BORROWED != RECLAIMABLE
    token = token_create_personal(user=ben, name="laptop", expires_at=None).raw
    return {"org": org, "ben": ben, "token": token, "jobs": Job.objects.filter(team=org.team_b)}


def _api(state: dict[str, Any]) -> dict[str, Any]:
    body = token_client(state["token"]).get("/api/v1/me/quota", {"team": state["org"].team_b.slug}).json()
    (team,) = body["teams"]
    (line,) = team["quotas"]
    return line


def _cli(state: dict[str, Any], url: str, home: str) -> tuple[int, str]:
    """`yard quota` as a user runs it, against the live server: its BORROWED column, and its whole output."""
    env = {**os.environ, "YARD_URL": url, "YARD_TOKEN": state["token"], "XDG_CONFIG_HOME": home, "COLUMNS": "200"}
    done = subprocess.run(
        [yard_executable(), "quota", "--team", state["org"].team_b.slug], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if "BORROWED" in line)
    (row,) = [line.split() for line in lines if line.split()[:1] == [state["org"].team_b.slug]]
    # TEAM GPU GUARANTEED LIMIT "IN USE" BORROWED ...: the columns before BORROWED are never empty here.
    assert header.split()[:7] == ["TEAM", "GPU", "GUARANTEED", "LIMIT", "IN", "USE", "BORROWED"]
    assert row[:5] == [state["org"].team_b.slug, "H100", str(GUARANTEED), "16", str(HELD)]
    return int(row[5]), done.stdout


def _quota_page(client: Client, state: dict[str, Any]) -> int:
    body = client.get(reverse("quotas")).content.decode()
    cell = re.search(rf'id="q-{state["org"].team_b.pk}-H100">(.*?)</td>', body, re.S)
    assert cell is not None
    tiers = re.search(r'data-tiers="(\d+),(\d+),(\d+),(\d+)"', cell.group(1))
    assert tiers is not None
    t1, t2, t3, borrowed = map(int, tiers.groups())
    assert (t1, t2, t3) == (0, GUARANTEED, 0)  # both jobs are Tier 2: they claim the whole guarantee
    assert f"; borrowed {borrowed}</p>" in cell.group(1)
    return borrowed


def _dashboard(client: Client) -> int:
    body = client.get(reverse("dashboard")).content.decode()
    found = re.search(r"(\d+) borrowed beyond the guarantee", body)
    assert found is not None
    assert f"Jobs holding {RECLAIMABLE} of these GPUs run on borrowed quota" in body
    return int(found.group(1))


def _metrics(client: Client) -> float:
    response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    assert response.status_code == 200
    families = {f.name: f.samples for f in text_string_to_metric_families(response.content.decode())}
    return next(s.value for s in families["yard_quota_borrowed_gpus"] if s.labels == {"team": "team-b", "gpu_type": "H100"})


def _report(client: Client, state: dict[str, Any]) -> dict[str, str]:
    """This month's usage CSV (the report page's download), team-b's H100 row."""
    response = client.get(reverse("report-usage-csv"), {"unit": state["org"].team_b.pk})
    assert response.status_code == 200
    (row,) = [r for r in csv.DictReader(io.StringIO(response.content.decode())) if r["gpu_type"] == "H100"]
    return row


def test_borrowed_is_the_gpus_beyond_the_guarantee_in_the_api_the_cli_the_portal_and_the_report(
    state: dict[str, Any], live_server: Any, tmp_path: Any
) -> None:
    api = _api(state)
    cli_borrowed, cli_out = _cli(state, live_server.url, str(tmp_path))
    assert "beyond the guarantee" in cli_out

    client = Client()
    client.force_login(state["ben"])
    page_borrowed = _quota_page(client, state)
    dashboard_borrowed = _dashboard(client)
    metrics_borrowed = _metrics(client)

    # The report counts GPU-hours beyond the guarantee. The state has held still since every allocation
    # began at one moment, so over the report's hours it is the borrowed GPUs times the hours:
    # borrowed GPU-hours / used GPU-hours = borrowed GPUs / GPUs in use.
    row = _report(client, state)
    used_h, borrowed_h = float(row["used_gpu_hours"]), float(row["borrowed_gpu_hours"])
    assert used_h > 0
    report_borrowed = borrowed_h / used_h * HELD

    figures = {
        "api": api["borrowed"],
        "cli": cli_borrowed,
        "quota page": page_borrowed,
        "dashboard": dashboard_borrowed,
        "metrics": metrics_borrowed,
        "report": pytest.approx(report_borrowed, abs=1e-3),
    }
    assert figures == dict.fromkeys(figures, BORROWED)  # the API and the CLI said 8: every GPU of the flagged gang

    # What a reclaim could take is its own figure; the other quota endpoint reads the same.
    assert api == {
        "gpu_type": "H100", "guaranteed": GUARANTEED, "limit": 16, "used": HELD, "borrowed": BORROWED,
        "reclaimable": RECLAIMABLE,
    }  # fmt: skip
    team_quota = token_client(state["token"]).get(f"/api/v1/teams/{state['org'].team_b.pk}/quota").json()
    assert team_quota["quotas"] == [api]


def test_a_team_within_its_guarantee_borrows_nothing_though_it_has_a_stale_borrowed_flag(db: Any) -> None:
    org = make_org()
    node = make_cluster(nodes=1)[0]
    ann = make_user("ann", unit=org.team_a, role=Role.MEMBER)
    running_job(team=org.team_a, user=ann, node=node, gpus=4, start=timezone.now(), borrowed=True)
    token = token_create_personal(user=ann, name="laptop", expires_at=None).raw
    (team,) = token_client(token).get("/api/v1/me/quota").json()["teams"]
    assert team["quotas"] == [{"gpu_type": "H100", "guaranteed": 16, "limit": 32, "used": 4, "borrowed": 0, "reclaimable": 4}]
