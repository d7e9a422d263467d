"""kill -9 of an agent, kept dead past node-down: its workload is gone before the job's next attempt starts.

The agent's watchdog (a separate process, nodeagent/watchdog.py) stops the workload once the agent has
not renewed its lease for fence_after_s; the portal requeues the job only after node-down, which the
settings keep longer than fence_after_s + the grace. The test watches both processes through /proc and
prints the overlap (before the watchdog, the first attempt ran on until its agent came back).
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest

from scheduling.agent.tasks import check_nodes
from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Task
from scheduling.states import JobState
from tests.e2e.conftest import Harness, alive, script, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TIMINGS = {
    "HEARTBEAT_INTERVAL_S": 0.5,
    "NODE_NOT_READY_S": 2.0,
    "NODE_DOWN_S": 8.0,
    "AGENT_STOP_AFTER_S": 4.0,
    "AGENT_FENCE_AFTER_S": 3.0,
    "AGENT_MAX_GRACE_S": 1.0,
    "GRACE_PERIOD_S": 1.0,
    "LIVENESS_TICK_S": 0.3,
    "LIVENESS_BLIND_GAP_S": 5.0,
}

WORKLOAD = """
import os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
(out / ("attempt-%s" % os.environ["YARD_ATTEMPT"])).write_text("%d %f" % (os.getpid(), time.time()))
while True:
    time.sleep(0.05)
"""


def test_a_killed_agents_workload_is_gone_before_the_next_attempt_starts(harness: Harness, settings: Any) -> None:
    settings.YARD = {**settings.YARD, **TIMINGS}
    harness.start_agent("dead-a", gpus=2)
    harness.start_agent("dead-b", gpus=2)
    harness.node_ready("dead-a")
    harness.node_ready("dead-b")
    job = harness.submit("survivor", script(harness.root, "loop", WORKLOAD), replicas=1, gpus_per_replica=2)
    harness.place(job)
    harness.job_in(job, JobState.RUNNING)
    first = wait_for(
        "attempt 1 running", lambda: (harness.root / "attempt-1").exists() and (harness.root / "attempt-1").read_text()
    )
    pid1 = int(first.split()[0])
    host = Task.objects.get(job=job, attempt=1).node.name
    # The agent must have its watchdog limits from the portal before it dies.
    lease = harness.root / "agents" / host / "agent-lease"
    wait_for("limits adopted", lambda: lease.exists() and b'"fence_after_s": 3.0' in lease.read_bytes())

    harness.kill_agent(host)  # SIGKILL: no goodbye, the workload is orphaned
    killed = time.time()
    gone_at: float | None = None
    started2: float | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and started2 is None:
        if gone_at is None and not alive(pid1):
            gone_at = time.time()
        check_nodes()  # the test plays beat: liveness and cycles
        run_cycle_once()
        marker = harness.root / "attempt-2"
        if marker.exists() and marker.read_text():
            started2 = float(marker.read_text().split()[1])
        time.sleep(0.05)
    assert started2 is not None, Job.objects.get(pk=job.pk).pending_reason
    if gone_at is None and not alive(pid1):
        gone_at = time.time()
    assert gone_at is not None, "attempt 1 still runs while attempt 2 started"
    overlap = max(0.0, gone_at - started2)
    print(
        f"agent killed; attempt 1 gone {gone_at - killed:.1f} s later (watchdog), attempt 2 started {started2 - killed:.1f} s "
        f"later on another node: overlap {overlap:.1f} s"
    )
    assert overlap == 0.0
    assert Task.objects.get(job=job, attempt=2).node.name != host
    fenced = harness.root / "agents" / host / "tasks" / f"{Task.objects.get(job=job, attempt=1).pk}-1" / "fenced"
    assert "agent gone" in fenced.read_text()
    assert os.path.exists(harness.root / "attempt-2")
