"""The idle reaper on the real path, on PostgreSQL and on SQLite (the demo's database).

Everything is the real thing: gunicorn, a Celery worker and beat (which runs the reaper's task), and a
`nodeagent.fleet` process whose agents run real JupyterLab servers and a real batch workload on
simulated GPUs. The agents fold GPU utilisation into windows and send them over the agent API, exactly
as in production; a notebook's utilisation is what its workload writes to its simulated GPU. Windows
are 5 s and the idle timeout 20 s here (YARD_TELEMETRY_WINDOW_S, an IdlePolicy of the team), so that a
test takes seconds, not the default 45 minutes.

Asserted: the idle notebook is warned and then stopped by the reaper (its job ends with IDLE_TIMEOUT);
a busy notebook and an idle batch job are left alone; the windows the reaper read are those the agents
sent; the month's report counts the reaped GPU-hours.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from bench.stack import Stack

pytestmark = [pytest.mark.slow]

ENV = {
    "YARD_TELEMETRY_WINDOW_S": "5",
    "YARD_REAPER_INTERVAL_S": "2",
    "YARD_HEARTBEAT_INTERVAL_S": "1",
    "YARD_CYCLE_INTERVAL_S": "1",
}
POLICY = """
from scheduling.models import IdlePolicy
from tenants.models import OrgUnit
IdlePolicy.objects.create(unit=OrgUnit.objects.get(slug="bench"), timeout_s=20, warn_lead_s=10, allow_extend=True, extend_s=60)
"""


def _post(stack: Stack, path: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        stack.url + path,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def _get(stack: Stack, path: str) -> dict[str, object]:
    request = urllib.request.Request(stack.url + path, headers={"Authorization": f"Bearer {stack.token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return dict(json.loads(response.read()))


def _state(stack: Stack, job_id: int) -> tuple[str, str]:
    return tuple(stack.sql("SELECT state, stop_reason FROM scheduling_job WHERE id = %s", (job_id,))[0])  # type: ignore[return-value]


def _util_file(stack: Stack, job_id: int) -> Path:
    (task_id,) = stack.sql("SELECT id FROM scheduling_task WHERE job_id = %s", (job_id,))[0]
    found = list(stack.tmp.glob(f"fleet-*/*/tasks/{task_id}-1"))
    assert found, f"no task directory for task {task_id}"
    return found[0] / "sim-util"


@pytest.mark.parametrize("database", ["postgresql", "sqlite"])
def test_the_reaper_warns_then_stops_an_idle_notebook_from_live_telemetry(database: str) -> None:
    with Stack(nodes=2, fleets=1, nodes_file="4xH100", extra_env=ENV, database=database) as stack:
        stack.django(POLICY)
        stack.wait_ready(timeout=120)
        idle = int(_post(stack, "/api/v1/notebooks", {"name": "idle", "team": "bench", "gpus": 1, "gpu_type": "H100"})["id"])
        busy = int(_post(stack, "/api/v1/notebooks", {"name": "busy", "team": "bench", "gpus": 1, "gpu_type": "H100"})["id"])
        batch = int(
            _post(stack, "/api/v1/jobs", {"name": "quiet-batch", "team": "bench", "replicas": 1, "gpus_per_replica": 1,
                                          "gpu_type": "H100", "command": "exec sleep 600"})["id"]
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(_state(stack, j)[0] != "RUNNING" for j in (idle, busy, batch)):
            time.sleep(0.5)
        assert [_state(stack, j)[0] for j in (idle, busy, batch)] == ["RUNNING"] * 3
        # The busy notebook's workload keeps its GPU at 90 % (as a kernel training on it would).
        _util_file(stack, busy).write_text("90\n")
        started = time.monotonic()
        while time.monotonic() - started < 120 and _state(stack, idle)[0] == "RUNNING":
            time.sleep(1)
        stopped_after = time.monotonic() - started
        events = [r for (r,) in stack.sql("SELECT reason FROM scheduling_jobevent WHERE job_id = %s ORDER BY id", (idle,))]
        windows = stack.sql(
            "SELECT w.samples, w.utilization_max FROM scheduling_gpuwindow w JOIN scheduling_allocation a ON a.gpu_id = w.gpu_id "
            "WHERE a.job_id = %s AND w.start >= a.allocated_at",
            (idle,),
        )
        busy_windows = stack.sql(
            "SELECT max(w.utilization_max) FROM scheduling_gpuwindow w JOIN scheduling_allocation a ON a.gpu_id = w.gpu_id "
            "WHERE a.job_id = %s",
            (busy,),
        )
        # The reaper stopped it with SIGTERM; the agent reports the end, and the job ends cancelled.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _state(stack, idle)[0] != "CANCELLED":
            time.sleep(0.5)
        month = time.strftime("%Y-%m")
        report = _get(stack, f"/api/v1/reports/usage?month={month}")
        print(
            f"{database}: idle notebook stopped {stopped_after:.0f} s after the busy one went busy; "
            f"{len(windows)} windows of its GPU from the agent (max utilisation {max((u for _, u in windows), default=None)}); "
            f"busy notebook's peak {busy_windows[0][0]}; events {[e[:40] for e in events[-3:]]}"
        )
        assert _state(stack, idle) == ("CANCELLED", "IDLE_TIMEOUT")
        assert any(e.startswith("idle warning") for e in events), events
        assert windows and all(samples > 0 and util == 0 for samples, util in windows)
        assert busy_windows[0][0] == 90.0
        assert _state(stack, busy)[0] == "RUNNING"
        assert _state(stack, batch)[0] == "RUNNING"
        reaped = sum(float(row.get("idle_reaped_gpu_hours", 0)) for row in _rows(report))
        assert reaped > 0, report


def _rows(report: dict[str, object]) -> list[dict[str, object]]:
    rows = report.get("rows")
    return [r for r in rows if isinstance(r, dict) and r.get("unit_kind") == "team"] if isinstance(rows, list) else []
