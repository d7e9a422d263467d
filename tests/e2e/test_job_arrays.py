"""A job array on a real agent: a batch script's #SBATCH --array=0-3%1, translated and submitted over the
API, its tasks placed by real cycles one at a time, each running with its own SLURM_ARRAY_TASK_ID and
writing its --output=out-%A_%a.txt."""

from __future__ import annotations

import json
import urllib.request
from itertools import pairwise
from pathlib import Path

import pytest

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Task
from scheduling.states import ACTIVE_STATES, JobState
from tests.e2e.conftest import Harness, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SCRIPT = """#!/bin/bash
#SBATCH --account=team-a
#SBATCH --gres=gpu:1
#SBATCH --time=00:10:00
#SBATCH --array=0-3%1
#SBATCH --output=out-%A_%a.txt
echo "task $SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT in array $SLURM_ARRAY_JOB_ID, job $SLURM_JOB_ID"
"""


def test_an_sbatch_array_runs_its_tasks_one_at_a_time_each_with_its_index(harness: Harness) -> None:
    harness.start_agent("e2e-a", gpus=2)
    harness.node_ready("e2e-a")
    request = urllib.request.Request(
        harness.url + "/api/v1/jobs",
        data=SCRIPT.encode(),
        headers={"Authorization": f"Bearer {harness.api_token}", "Content-Type": "text/x-shellscript"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        array = json.loads(response.read())
    assert (array["task_count"], array["max_running"]) == (4, 1)
    tasks = list(Job.objects.filter(array_id=array["id"]).order_by("array_index"))
    for _ in tasks:
        run_cycle_once()
        running = Job.objects.filter(array_id=array["id"], state__in=ACTIVE_STATES)
        assert running.count() == 1  # two GPUs free, but %1
        harness.job_in(running.get(), JobState.COMPLETED, timeout=60)
    assert set(Job.objects.filter(array_id=array["id"]).values_list("state", flat=True)) == {JobState.COMPLETED}
    for task in tasks:
        run = Task.objects.get(job=task, attempt=1)
        out = wait_for(
            f"out-{array['id']}_{task.array_index}.txt",
            lambda run=run, task=task: _read(harness.root, run, f"out-{array['id']}_{task.array_index}.txt"),
            timeout=10,
        )
        assert out == f"task {task.array_index} of 4 in array {array['id']}, job {task.pk}\n"
    spans = sorted((t.started_at, t.ended_at) for t in Task.objects.filter(job__array_id=array["id"]))
    assert all(earlier[1] <= later[0] for earlier, later in pairwise(spans))  # never two at once


def _read(root: Path, run: Task, name: str) -> str | None:
    """The file in the task's run directory on its agent's node (nodeagent: STATE_DIR/tasks/TASK-ATTEMPT), once written."""
    path = root / "agents" / run.node.name / "tasks" / f"{run.pk}-{run.attempt}" / name
    return path.read_text() if path.is_file() and path.read_text().endswith("\n") else None
