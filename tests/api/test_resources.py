"""Cores and memory per replica through the REST API: defaults by GPU count, bounds, and the cycle's word."""

import pytest

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Node
from tests.api.conftest import job_body, token_client

pytestmark = pytest.mark.django_db


def test_a_job_that_does_not_say_gets_the_default_per_gpu(cast, nodes):
    body = token_client(cast.ann_token).post(
        "/api/v1/jobs", job_body(cast.org.team_a, replicas=1, gpus_per_replica=2), format="json"
    )
    assert body.status_code == 201, body.json()
    assert (body.json()["cpus_per_replica"], body.json()["memory_mb_per_replica"]) == (16, 2 * 64 * 1024)
    job = Job.objects.get(pk=body.json()["id"])
    assert (job.cpus_per_replica, job.memory_mb_per_replica) == (16, 131072)


def test_given_cores_and_memory_are_kept_and_bad_ones_name_the_field(cast, nodes):
    client = token_client(cast.ann_token)
    ok = client.post("/api/v1/jobs", job_body(cast.org.team_a, cpus_per_replica=12, memory_mb_per_replica=4096), format="json")
    assert ok.status_code == 201 and (ok.json()["cpus_per_replica"], ok.json()["memory_mb_per_replica"]) == (12, 4096)
    bad = client.post("/api/v1/jobs", job_body(cast.org.team_a, cpus_per_replica=0, memory_mb_per_replica="lots"), format="json")
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"cpus_per_replica", "memory_mb_per_replica"}


def test_cores_no_node_has_are_refused_and_short_cores_are_the_pending_reason(cast, nodes):
    Node.objects.update(cpus=114, memory_mb=2 * 1024 * 1024)  # 112 cores for jobs after the default reserve of 2
    client = token_client(cast.ann_token)
    never = client.post("/api/v1/jobs", job_body(cast.org.team_a, replicas=1, cpus_per_replica=200), format="json")
    assert never.status_code == 400
    assert "asks 200 CPU cores, but the largest H100 node gives jobs 112" in never.json()["message"]
    # Seven 1-GPU jobs of 16 cores take a node's 112; an eighth waits for cores, not GPUs.
    Node.objects.exclude(pk=nodes[0].pk).update(state="DRAINING")
    ids = [
        client.post(
            "/api/v1/jobs", job_body(cast.org.team_a, replicas=1, gpus_per_replica=1, cpus_per_replica=16), format="json"
        ).json()["id"]
        for _ in range(8)
    ]
    run_cycle_once()
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids)}
    assert sum(j.state == "STARTING" for j in jobs.values()) == 7
    last = jobs[max(ids)]
    assert last.state == "PENDING"
    assert last.pending_reason.startswith(
        f"node {nodes[0].name} has 1 free H100 but 0 of 112 cores free; the job asks 16 per replica"
    )
