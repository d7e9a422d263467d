"""A node agent whose state directory fills up (a 2 MiB tmpfs under a real agent process).

What must hold (issue: overload and broken dependencies never kill work): the agent says so in its
heartbeat and the node takes no new work (DRAINING "disk full: …", shown on the cluster page); a launch
that reaches it meanwhile is refused before anything starts and its job is requeued onto another node
(not failed); a cancel completes although nothing can be written; the running workload is not killed;
the agent logs the problem once, with no traceback; and once there is room again the node returns to
READY by itself. Prints what it saw.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, JobEvent, Node, NodeState, Task
from scheduling.services import job_cancel
from scheduling.states import JobState
from tests.e2e.conftest import Harness, alive, script, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LOOP = """
import os, pathlib, time
out = pathlib.Path(os.environ["OUT_DIR"])
(out / ("%s-%s" % (os.environ["YARD_JOB_ID"], os.environ["YARD_ATTEMPT"]))).write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


@pytest.fixture
def small_disk(harness: Harness) -> Any:
    """agents/disk-a on a 2 MiB tmpfs (root can mount one; anyone else skips with that reason)."""
    where = harness.root / "agents" / "disk-a"
    where.mkdir(parents=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        harness.stop_everything()
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(where: Path) -> Path:
    """Write until the file system refuses (ENOSPC)."""
    filler = where / "filler"
    with contextlib.suppress(OSError), open(filler, "wb") as handle:
        while True:
            handle.write(b"\0" * 65536)
            handle.flush()
    return filler


def test_a_full_disk_takes_the_node_out_requeues_what_it_could_not_start_and_kills_nothing(
    harness: Harness, small_disk: Path, settings: Any, client: Client
) -> None:
    settings.YARD = {**settings.YARD, "HEARTBEAT_INTERVAL_S": 0.5, "NODE_NOT_READY_S": 30.0, "NODE_DOWN_S": 60.0}
    agent = harness.start_agent("disk-a", gpus=4)
    harness.node_ready("disk-a")
    loop = script(harness.root, "loop", LOOP)
    kept = harness.submit("kept", loop, replicas=1, gpus_per_replica=1)
    doomed = harness.submit("doomed", loop, replicas=1, gpus_per_replica=1)
    run_cycle_once()
    harness.job_in(kept, JobState.RUNNING)
    harness.job_in(doomed, JobState.RUNNING)
    kept_pid = int(
        wait_for("kept runs", lambda: (harness.root / f"{kept.pk}-1").exists() and (harness.root / f"{kept.pk}-1").read_text())
    )

    # The agent is paused while its disk fills and a job is placed on it: the portal, which has not
    # heard of the disk yet, sends the launch with the very heartbeat that first reports the disk.
    agent.send_signal(signal.SIGSTOP)
    try:
        filler = _fill(small_disk)
        late = harness.submit("late", loop, replicas=1, gpus_per_replica=1)
        result = run_cycle_once()
        assert late.pk in result.placed, Job.objects.get(pk=late.pk).pending_reason
        assert Task.objects.get(job=late, attempt=1).node.name == "disk-a"
    finally:
        agent.send_signal(signal.SIGCONT)
    node = wait_for("the node drained for its disk", lambda: Node.objects.filter(name="disk-a", state=NodeState.DRAINING).first())
    assert node.state_reason.startswith("disk full: ") and "free of" in node.state_reason, node.state_reason
    assert node.disk_problem

    # The launch was refused, cleanly: nothing started, and the job went back to the queue (not FAILED).
    requeued = harness.job_in(late, JobState.PENDING, timeout=30)
    assert requeued.attempt == 2
    assert not (harness.root / f"{late.pk}-1").exists()
    words = list(JobEvent.objects.filter(job=late).values_list("reason", flat=True))
    assert any("could not start" in w for w in words), words
    # …and a second node takes it.
    harness.start_agent("disk-b", gpus=2)
    harness.node_ready("disk-b")
    run_cycle_once()
    harness.job_in(late, JobState.RUNNING)
    assert Task.objects.get(job=late, attempt=2).node.name == "disk-b"

    # A cancel completes although the agent cannot write its journal.
    job_cancel(job=Job.objects.get(pk=doomed.pk), actor=harness.user)
    harness.job_in(doomed, JobState.CANCELLED, timeout=30)

    # The cluster page says what is wrong; the other workload was never touched.
    harness.user.is_staff = True
    client.force_login(harness.user)
    page = client.get("/cluster/").content.decode()
    assert "disk full: " in page
    assert alive(kept_pid) and Job.objects.get(pk=kept.pk).state == JobState.RUNNING

    # Room again: the node takes work by itself, no admin needed.
    freed_at = time.monotonic()
    filler.unlink()
    node = wait_for("the node READY again", lambda: Node.objects.filter(name="disk-a", state=NodeState.READY).first())
    back_s = time.monotonic() - freed_at
    assert node.disk_problem == "" and node.state_reason == "its disk has room again"
    assert alive(kept_pid) and Job.objects.get(pk=kept.pk).state == JobState.RUNNING
    log = harness.agent_log("disk-a")
    assert "Traceback" not in log, log[-3000:]
    journal_errors = log.count("cannot write the journal")
    print(
        f"\nfull disk: node drained, launch refused and requeued (attempt 2 on disk-b), cancel completed, "
        f"1 workload kept running (0 killed); journal errors logged {journal_errors}x; READY {back_s:.1f} s after room came back"
    )
