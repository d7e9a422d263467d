"""The accelerate multi-node sbatch script, unchanged, through the real stack: posted to a live portal,
placed by the cycle on four real agents (simulated GPUs, all on 127.0.0.1 as on the demo), run as far
as its own missing files allow. `accelerate` is a stand-in that reports what it was started with and
fails as python does on the example file this machine lacks; the script reaches it with the head
node resolved and the Slurm variables of each task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from nodeagent import hostlist
from scheduling.models import Job, Node
from scheduling.states import JobState
from tests.cli.test_real_jobfiles import real_text
from tests.e2e.conftest import MARK, REPO, Harness

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

STAND_IN = r"""#!/bin/bash
echo "accelerate stand-in: nodelist=$SLURM_JOB_NODELIST nnodes=$SLURM_NNODES nodeid=$SLURM_NODEID procid=$SLURM_PROCID" \
  "name=$SLURM_JOB_NAME head=$(scontrol show hostnames | head -n 1) args: $*"
for word in "$@"; do
  case "$word" in
    *.py) [ -e "$word" ] || { echo "python: can't open file '$word': [Errno 2] No such file or directory" >&2; exit 2; } ;;
  esac
done
"""


def _start_agent(harness: Harness, name: str, bin_dir: Path) -> None:
    """An agent of the script's node size (4 GPUs, 192 cores: it asks 160 per task), with the stand-in on PATH."""
    command = [
        sys.executable, "-m", "nodeagent", "--portal", harness.url, "--token", harness.enrolment,
        "--simulate", "4xH100", "--sim-cpus", "192", "--name", name, "--address", "127.0.0.1",
        "--leaf", "leaf-1", "--spine", "spine-1", "--state-dir", str(harness.root / "agents" / name),
    ]  # fmt: skip
    env = {**os.environ, MARK: harness.mark, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    log = open(harness.root / f"agent-{name}.log", "ab")  # noqa: SIM115 - the child holds it
    harness.agents[name] = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)


def test_the_accelerate_script_unchanged_reaches_accelerate_launch_on_four_nodes(harness: Harness) -> None:
    bin_dir = harness.root / "bin"
    bin_dir.mkdir()
    (bin_dir / "accelerate").write_text(STAND_IN)
    (bin_dir / "accelerate").chmod(0o755)
    names = [f"sbatch-{c}" for c in "abcd"]
    for name in names:
        _start_agent(harness, name, bin_dir)
    for name in names:
        harness.node_ready(name)

    request = urllib.request.Request(
        f"{harness.url}/api/v1/jobs?team={harness.org.team_a.slug}",
        data=real_text("accelerate-submit_multinode.sh").encode(),
        headers={"Authorization": f"Bearer {harness.api_token}", "Content-Type": "text/x-shellscript"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.status == 201
        job = Job.objects.get(pk=json.loads(response.read())["id"])
    harness.place(job)
    done = harness.job_in(job, JobState.FAILED, JobState.COMPLETED, timeout=60)
    assert done.state == JobState.FAILED  # the example file is missing here, as the script's own warning said

    tasks = harness.tasks(job)
    ranked = [Node.objects.get(pk=t.node_id).name for t in tasks]
    assert sorted(ranked) == names  # four replicas, four distinct nodes
    nodelist = hostlist.compress(ranked)
    for rank, _ in enumerate(tasks):
        text = harness.api_get(f"/api/v1/jobs/{job.pk}/logs?rank={rank}")["text"]
        assert (
            f"accelerate stand-in: nodelist={nodelist} nnodes=4 nodeid={rank} procid={rank} name=multinode "
            "head=127.0.0.1 args: launch --num_processes 16 --num_machines 4 --rdzv_backend c10d "
            "--main_process_ip 127.0.0.1 --main_process_port 29500"
        ) in text, text
        assert "python: can't open file '/accelerate/examples/complete_nlp_example.py'" in text
        assert "activateEnvironment.sh: No such file or directory" in text
