"""A 2-node × 2-GPU gang on two real agents: each rank sees its place, the job completes, logs read back."""

from __future__ import annotations

import json

import pytest

from scheduling.states import JobState, TaskState
from tests.e2e.conftest import Harness, script

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REPORT_ENV = """
import json, os
keys = ["RANK", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT",
        "YARD_JOB_ID", "YARD_ATTEMPT", "YARD_NUM_GPUS", "YARD_CHECKPOINT_DIR"]
with open(os.path.join(os.environ["OUT_DIR"], "rank-%s.json" % os.environ["RANK"]), "w") as out:
    json.dump({k: os.environ.get(k) for k in keys}, out)
print("hello from rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"])
"""


def test_a_two_node_gang_runs_each_rank_in_its_place_and_completes(harness: Harness) -> None:
    harness.start_agent("e2e-a")
    harness.start_agent("e2e-b")
    harness.node_ready("e2e-a")
    harness.node_ready("e2e-b")
    job = harness.submit("gang", script(harness.root, "report_env", REPORT_ENV), replicas=2, gpus_per_replica=2)
    harness.place(job)

    done = harness.job_in(job, JobState.COMPLETED, JobState.FAILED)

    assert done.state == JobState.COMPLETED, harness.agent_log("e2e-a")
    tasks = harness.tasks(job)
    assert {t.node.name for t in tasks} == {"e2e-a", "e2e-b"}
    assert all(t.state == TaskState.EXITED and t.exit_code == 0 for t in tasks)
    seen = [json.loads((harness.root / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    for rank, env in enumerate(seen):
        assert (env["RANK"], env["NODE_RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(rank), str(rank), "0", "2")
        # Each node has two GPUs and the rank holds both: local indices, as NVML numbers them.
        assert (env["CUDA_VISIBLE_DEVICES"], env["YARD_NUM_GPUS"]) == ("0,1", "2")
        assert (env["YARD_JOB_ID"], env["YARD_ATTEMPT"]) == (str(job.pk), "1")
        assert env["YARD_CHECKPOINT_DIR"] == done.checkpoint_dir
    assert seen[0]["MASTER_ADDR"] == seen[1]["MASTER_ADDR"] == "127.0.0.1"
    assert seen[0]["MASTER_PORT"] == seen[1]["MASTER_PORT"] == str(tasks[0].master_port)


def test_a_finished_jobs_logs_are_readable_through_the_api(harness: Harness) -> None:
    harness.start_agent("e2e-a")
    harness.node_ready("e2e-a")
    job = harness.submit("hello", script(harness.root, "report_env", REPORT_ENV))
    harness.place(job)
    harness.job_in(job, JobState.COMPLETED)

    logs = harness.api_get(f"/api/v1/jobs/{job.pk}/logs?rank=0")

    assert "hello from rank 0 of 1" in logs["text"]
    assert not harness.workload_pids()
