"""An agent killed with SIGKILL and restarted adopts its running workloads and starts nothing twice."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduling.models import Node
from scheduling.services import job_request_stop
from scheduling.states import JobState
from tests.e2e.conftest import Harness, script, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

COUNTS_ITS_STARTS = """
import os, pathlib, time
with open(pathlib.Path(os.environ["OUT_DIR"], "starts"), "a") as starts:
    starts.write("%d\\n" % os.getpid())
while True:
    time.sleep(0.1)
"""


def test_a_restarted_agent_adopts_its_workload_and_starts_it_once(harness: Harness) -> None:
    harness.start_agent("e2e-a")
    harness.node_ready("e2e-a")
    job = harness.submit("long", script(harness.root, "long", COUNTS_ITS_STARTS))
    harness.place(job)
    harness.job_in(job, JobState.RUNNING)
    starts = harness.root / "starts"
    wait_for("the workload started", starts.exists)
    before = harness.workload_pids()

    harness.kill_agent("e2e-a")
    assert harness.workload_pids() == before  # the workload does not die with its agent
    restarted_at = timezone.now()
    harness.start_agent("e2e-a")
    wait_for(
        "heartbeats from the restarted agent",
        lambda: Node.objects.filter(name="e2e-a", last_heartbeat__gt=restarted_at).exists(),
    )
    # Several more heartbeats, each a reconciliation in which a second start would happen.
    beats: set[object] = set()

    def three_more_beats() -> bool:
        beats.add(Node.objects.values_list("last_heartbeat", flat=True).get(name="e2e-a"))
        return len(beats) > 3

    wait_for("three more heartbeats from the restarted agent", three_more_beats)

    (started,) = starts.read_text().split()  # started once, never again
    assert int(started) in before
    assert harness.workload_pids() == before
    assert "adopted task" in harness.agent_log("e2e-a")

    # The adopted workload is under the new agent's control: a cancel stops it.
    job_request_stop(job=job, reason="CANCELLED", grace_s=2, actor_label="e2e")
    harness.job_in(job, JobState.CANCELLED)
    wait_for("the workload gone", lambda: not harness.workload_pids(), timeout=5)
