"""A 2-replica job in a container image through the whole stack (issue 26).

The portal is the live server (real HTTP), the scheduler's cycle is run in-process as the beat would,
and two real node agents (``python -m nodeagent`` subprocesses, one simulated GPU each) pull the test
image from Debian's docker-registry on loopback and run each rank in its own runc container. The ranks
meet over the host's network at MASTER_ADDR:MASTER_PORT, a preemption's SIGTERM makes each write a
checkpoint inside its container (the checkpoint directory is mounted at its host path), attempt 2
finds it, and a cancel ends the job with no container left behind.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from scheduling.models import Job, Task, TaskLogChunk
from scheduling.services import job_cancel, job_request_stop
from scheduling.states import JobState
from tests.containers.conftest import image, registry  # noqa: F401  (fixtures used here)
from tests.e2e.conftest import Harness, harness, wait_for  # noqa: F401  (fixtures used here)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# busybox sh in the image. Rank 0 listens on the gang's port, rank 1 says hello to it; on SIGTERM each
# writes its checkpoint and exits 0; an attempt that finds one says so.
RANKS = r"""
ck="$YARD_CHECKPOINT_DIR/rank-$RANK"
if [ -f "$ck" ]; then echo "rank $RANK resumed from $(cat "$ck")"; fi
if [ "$RANK" = 0 ]; then
  nc -l -p "$MASTER_PORT" -e sh -c 'cat > /tmp/heard'
  echo "rank 0 heard: $(cat /tmp/heard)"
else
  i=0
  until echo "hello from rank 1 attempt $YARD_ATTEMPT" | nc "$MASTER_ADDR" "$MASTER_PORT"; do
    i=$((i + 1)); [ "$i" -gt 300 ] && exit 3; sleep 0.1
  done
fi
trap 'echo "attempt $YARD_ATTEMPT" > "$ck"; exit 0' TERM
touch "$OUT_DIR/ready-$RANK-$YARD_ATTEMPT"
while true; do sleep 0.2; done
"""


def _log(task: Task) -> str:
    return "".join(TaskLogChunk.objects.filter(task=task).order_by("offset").values_list("data", flat=True))


def _ready(root: Path, attempt: int) -> bool:
    return all((root / f"ready-{rank}-{attempt}").exists() for rank in (0, 1))


def _runc_ids(stack: Harness) -> list[str]:
    ids = []
    for name in stack.agents:
        state = stack.root / "agents" / name / "runc"
        if state.exists():
            done = subprocess.run(["runc", "--root", str(state), "list", "-q"], capture_output=True, text=True, timeout=30)
            ids += done.stdout.split()
    return ids


def test_a_two_replica_job_in_an_image_rendezvous_checkpoints_resumes_and_cancels(harness: Harness, image: str) -> None:  # noqa: F811
    for name in ("ct-a", "ct-b"):
        harness.start_agent(name, gpus=1)
        harness.node_ready(name)
    job = harness.submit(
        "in-an-image",
        RANKS,
        replicas=2,
        gpus_per_replica=1,
        image=image,
        container_mounts=f"{harness.root}:{harness.root}",  # pyxis's SRC:DST: the test reads the ranks' files
    )
    assert job.image == image

    # Attempt 1: placed on both nodes, each pulls, both containers run and meet.
    harness.place(job)
    harness.job_in(job, JobState.RUNNING, timeout=60)
    wait_for("both ranks ready in attempt 1", lambda: _ready(harness.root, 1), timeout=60)
    rank0, rank1 = harness.tasks(job, attempt=1)
    assert {rank0.node.name, rank1.node.name} == {"ct-a", "ct-b"}
    wait_for("rank 0's log", lambda: "rank 0 heard: hello from rank 1 attempt 1" in _log(rank0), timeout=30)
    for name in ("ct-a", "ct-b"):
        assert "image " + image in harness.agent_log(name)  # the agent pulled it (or found it cached)
    assert len(_runc_ids(harness)) == 2

    # Preempted: SIGTERM inside both containers, each writes its checkpoint, the job is requeued.
    job_request_stop(job=Job.objects.get(pk=job.pk), reason="PREEMPTED", grace_s=10, actor_label="e2e")
    harness.job_in(job, JobState.PENDING, timeout=60)
    for task in harness.tasks(job, attempt=1):
        task.refresh_from_db()
        assert task.exit_code == 0, (task.exit_code, task.signal, _log(task))  # the trap ran: no SIGKILL
    checkpoints = Path(Job.objects.get(pk=job.pk).checkpoint_dir)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["rank-0", "rank-1"]
    assert (checkpoints / "rank-0").read_text().strip() == "attempt 1"

    # Attempt 2 resumes from the checkpoints written inside attempt 1's containers.
    harness.place(job)
    harness.job_in(job, JobState.RUNNING, timeout=60)
    wait_for("both ranks ready in attempt 2", lambda: _ready(harness.root, 2), timeout=60)
    rank0_2, rank1_2 = harness.tasks(job, attempt=2)
    wait_for("attempt 2's rendezvous", lambda: "rank 0 heard: hello from rank 1 attempt 2" in _log(rank0_2), timeout=30)
    assert "rank 0 resumed from attempt 1" in _log(rank0_2)
    wait_for("rank 1's log", lambda: "rank 1 resumed from attempt 1" in _log(rank1_2), timeout=30)  # shipped every 2 s

    # Cancelled: the job ends, and no container is left on either node.
    job_cancel(job=Job.objects.get(pk=job.pk), actor=harness.user)
    harness.job_in(job, JobState.CANCELLED, timeout=60)
    wait_for("no container left", lambda: not _runc_ids(harness), timeout=30)
