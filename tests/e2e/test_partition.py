"""An agent partitioned past DOWN: its gang is requeued exactly once, and on return it fences the stale work.

The partition is SIGSTOP on the agent process (its workloads, in their own sessions, keep running),
with small timings: heartbeat 0.5 s, NOT_READY 2 s, DOWN 4 s, agent stop-after 3 s. The test plays
Celery beat by running the liveness check itself.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from scheduling.agent.tasks import check_nodes
from scheduling.models import JobEvent, Node, NodeState
from scheduling.states import JobState, TaskState
from tests.e2e.conftest import Harness, script, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PARTITION_TIMINGS = {
    "HEARTBEAT_INTERVAL_S": 0.5,
    "NODE_NOT_READY_S": 2.0,
    "NODE_DOWN_S": 4.0,
    "AGENT_STOP_AFTER_S": 3.0,
    "GRACE_PERIOD_S": 0.5,
}

RUNS_UNTIL_STOPPED = """
import os, pathlib, time
pathlib.Path(os.environ["OUT_DIR"], "rank-%s" % os.environ["RANK"]).write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def node_state(name: str) -> str:
    return Node.objects.get(name=name).state


def test_a_partitioned_node_is_requeued_once_and_fenced_on_return(harness: Harness, settings: Any) -> None:
    settings.YARD = {**settings.YARD, **PARTITION_TIMINGS}
    harness.start_agent("e2e-a")
    partitioned = harness.start_agent("e2e-b")
    harness.node_ready("e2e-a")
    harness.node_ready("e2e-b")
    job = harness.submit("gang", script(harness.root, "runs", RUNS_UNTIL_STOPPED), replicas=2, gpus_per_replica=2)
    harness.place(job)
    harness.job_in(job, JobState.RUNNING)
    healthy_rank, stale_rank = sorted(harness.tasks(job), key=lambda t: t.node.name != "e2e-a")
    wait_for("both ranks' processes", lambda: harness.workload_pids(healthy_rank) and harness.workload_pids(stale_rank))

    os.kill(partitioned.pid, signal.SIGSTOP)
    try:
        seen = set()

        def down() -> bool:
            check_nodes()
            seen.add(node_state("e2e-b"))
            return node_state("e2e-b") == NodeState.DOWN

        wait_for("node e2e-b DOWN", down, timeout=15, interval=0.3)
        assert NodeState.NOT_READY in seen  # it went through NOT_READY first
        fresh = type(job).objects.get(pk=job.pk)
        assert (fresh.state, fresh.attempt) == (JobState.PENDING, 2)
        assert {t.state for t in harness.tasks(job)} == {TaskState.LOST}
        # The healthy node's agent fences its rank of the lost gang on its next heartbeat.
        wait_for("the healthy rank fenced", lambda: not harness.workload_pids(healthy_rank), timeout=8)
        # Nobody is left to stop the partitioned node's rank: it still runs.
        assert harness.workload_pids(stale_rank)
    finally:
        os.kill(partitioned.pid, signal.SIGCONT)
    returned = time.monotonic()

    wait_for("the stale rank fenced", lambda: not harness.workload_pids(stale_rank), timeout=8)
    # Within one heartbeat plus the agent's short fence grace (it exits at SIGTERM).
    assert time.monotonic() - returned < 0.5 + 5.0
    wait_for("node e2e-b READY after fencing", lambda: node_state("e2e-b") == NodeState.READY, timeout=8)
    for _ in range(3):
        check_nodes()
        time.sleep(0.3)
    assert JobEvent.objects.filter(job=job, to_state=JobState.LOST).count() == 1
    assert JobEvent.objects.filter(job=job, to_state=JobState.PENDING, attempt=2).count() == 1
    assert type(job).objects.get(pk=job.pk).attempt == 2
