"""An agent that hangs past DOWN: its node's watchdog stops the stale rank before the portal gives up on
the node, the gang is requeued exactly once after its healthy rank stopped too, and the agent, back,
reports what happened and is fenced clean.

The hang is SIGSTOP on the agent process (its workloads, in their own sessions, keep running; its
watchdog, a separate process, does not stop), with small timings: heartbeat 0.5 s, NOT_READY 2 s,
DOWN 4 s, agent stop-after 3 s, watchdog fence-after 1.5 s. The test plays Celery beat by running
the liveness check itself.
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
    "AGENT_FENCE_AFTER_S": 1.5,
    "AGENT_MAX_GRACE_S": 0.5,
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
    # Each agent learns of its rank from a heartbeat's answer: on a loaded machine (the suite's workers beside
    # other work) the first ones may be shed and come again seconds later.
    both = lambda: harness.workload_pids(healthy_rank) and harness.workload_pids(stale_rank)  # noqa: E731
    wait_for("both ranks' processes", both, timeout=60)

    # The agents learn the short watchdog limits from their heartbeats' answers.
    wait_for("limits adopted", lambda: b"1.5" in (harness.root / "agents" / "e2e-b" / "agent-lease").read_bytes())
    os.kill(partitioned.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        seen = set()
        # The hung agent renews no lease: its watchdog stops the stale rank before the node is DOWN.
        wait_for("the stale rank stopped by the watchdog", lambda: not harness.workload_pids(stale_rank), timeout=8)
        gone_after = time.monotonic() - stopped

        def down() -> bool:
            check_nodes()
            seen.add(node_state("e2e-b"))
            return node_state("e2e-b") == NodeState.DOWN

        wait_for("node e2e-b DOWN", down, timeout=15, interval=0.3)
        down_after = time.monotonic() - stopped
        print(f"stale rank gone {gone_after:.1f} s after the agent hung; node DOWN after {down_after:.1f} s")
        assert gone_after < down_after
        assert NodeState.NOT_READY in seen  # it went through NOT_READY first
        # The healthy node's rank is told to stop; the gang is requeued once it has.
        wait_for("the healthy rank stopped", lambda: not harness.workload_pids(healthy_rank), timeout=15)
        fresh = harness.job_in(job, JobState.PENDING, timeout=10)
        assert fresh.attempt == 2
        assert {t.state for t in harness.tasks(job)} <= {TaskState.LOST, TaskState.EXITED}
    finally:
        os.kill(partitioned.pid, signal.SIGCONT)

    wait_for("node e2e-b READY after fencing", lambda: node_state("e2e-b") == NodeState.READY, timeout=8)
    for _ in range(3):
        check_nodes()
        time.sleep(0.3)
    assert JobEvent.objects.filter(job=job, to_state=JobState.LOST).count() == 1
    assert JobEvent.objects.filter(job=job, to_state=JobState.PENDING, attempt=2).count() == 1
    assert type(job).objects.get(pk=job.pk).attempt == 2
    assert "agent gone" in (harness.root / "agents" / "e2e-b" / "tasks" / f"{stale_rank.pk}-1" / "fenced").read_text()
