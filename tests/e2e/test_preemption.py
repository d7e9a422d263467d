"""Preemption end to end: job_request_stop -> agent SIGTERM -> grace -> SIGKILL -> exited -> requeued."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.models import Job
from scheduling.services import job_request_stop
from scheduling.states import JobState
from tests.e2e.conftest import Harness, script, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

GRACE_S = 2

CHECKPOINTS_ON_SIGTERM = """
import os, pathlib, signal, sys, time
def on_term(signum, frame):
    pathlib.Path(os.environ["YARD_CHECKPOINT_DIR"], "step-100.pt").write_text("weights at step 100")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
pathlib.Path(os.environ["OUT_DIR"], "ready-%s" % os.environ["YARD_JOB_ID"]).write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""

IGNORES_SIGTERM = """
import os, pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
# A child that ignores SIGTERM too: the whole process group must go at the end of the grace.
subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
pathlib.Path(os.environ["OUT_DIR"], "ready-%s" % os.environ["YARD_JOB_ID"]).write_text(str(os.getpid()))
while True:
    time.sleep(0.1)
"""


def _running(harness: Harness, name: str, body: str) -> Job:
    job = harness.submit(name, script(harness.root, name, body))
    harness.place(job)
    job = harness.job_in(job, JobState.RUNNING)
    wait_for(f"{name} ready", lambda: (harness.root / f"ready-{job.pk}").exists())
    return job


@pytest.fixture
def preempted(harness: Harness) -> tuple[Harness, Job, Job]:
    """Both workloads running on one agent, then both preempted with a short grace."""
    harness.start_agent("e2e-a")
    harness.node_ready("e2e-a")
    polite = _running(harness, "polite", CHECKPOINTS_ON_SIGTERM)
    stubborn = _running(harness, "stubborn", IGNORES_SIGTERM)
    for job in (polite, stubborn):
        job_request_stop(job=job, reason="PREEMPTED", grace_s=GRACE_S, actor_label="e2e")
    for job in (polite, stubborn):
        harness.job_in(job, JobState.PENDING)
    return harness, Job.objects.get(pk=polite.pk), Job.objects.get(pk=stubborn.pk)


def test_a_workload_that_traps_sigterm_checkpoints_and_is_requeued(preempted: tuple[Harness, Job, Job]) -> None:
    harness, polite, _ = preempted
    (task,) = harness.tasks(polite)
    assert (task.stopped_by, task.exit_code, task.signal) == ("sigterm", 0, None)
    assert (Path(polite.checkpoint_dir) / "step-100.pt").read_text() == "weights at step 100"
    assert (polite.state, polite.attempt) == (JobState.PENDING, 2)
    assert polite.events.filter(to_state=JobState.PREEMPTED).count() == 1


def test_a_workload_that_ignores_sigterm_is_killed_at_the_end_of_the_grace(preempted: tuple[Harness, Job, Job]) -> None:
    harness, _, stubborn = preempted
    (task,) = harness.tasks(stubborn)
    assert (task.stopped_by, task.signal) == ("sigkill", 9)
    stop_ordered = stubborn.events.get(to_state=JobState.PREEMPTING).time
    assert task.ended_at is not None and (task.ended_at - stop_ordered).total_seconds() >= GRACE_S
    assert (stubborn.state, stubborn.attempt) == (JobState.PENDING, 2)


def test_no_process_of_a_preempted_workload_is_left(preempted: tuple[Harness, Job, Job]) -> None:
    harness, _, _ = preempted
    wait_for("every workload process gone", lambda: not harness.workload_pids(), timeout=5)
