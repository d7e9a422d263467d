"""What makes a submission cheap keeps its answers: the admission verdicts remembered per cluster shape
and quota chain, and the job serializers' fields built once per class."""

import threading

import pytest
from rest_framework import serializers
from rest_framework.test import APIRequestFactory

from scheduling.api import serializers as s
from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Node
from tenants.services import quota_set
from tests.api.conftest import job_body, token_client

pytestmark = pytest.mark.django_db


def test_a_limit_lowered_after_a_job_was_taken_refuses_the_same_job_next(cast, nodes):
    client = token_client(cast.ci_token)
    body = job_body(cast.org.team_a, replicas=4, gpus_per_replica=8)
    assert client.post("/api/v1/jobs", body, format="json").status_code == 201
    quota_set(actor=None, unit=cast.org.team_a, gpu_type="H100", guaranteed=16, limit=16)
    refused = client.post("/api/v1/jobs", body, format="json")
    assert refused.status_code == 400
    assert "limit of 16" in refused.json()["message"]


def test_a_cluster_that_shrank_refuses_a_job_it_took_before(cast, nodes):
    client = token_client(cast.ci_token)
    body = job_body(cast.org.team_a, replicas=2, gpus_per_replica=8)
    assert client.post("/api/v1/jobs", body, format="json").status_code == 201
    Node.objects.exclude(pk=nodes[0].pk).delete()
    refused = client.post("/api/v1/jobs", body, format="json")
    assert refused.status_code == 400
    assert "the whole cluster has 8" in refused.json()["message"]


class _BuiltByDrf(s.JobSubmitOut):
    """JobSubmitOut with its fields built as DRF builds them, at every instance."""

    def get_fields(self):
        return serializers.ModelSerializer.get_fields(self)


def _placed_job(cast) -> Job:
    response = token_client(cast.ci_token).post("/api/v1/jobs", job_body(cast.org.team_a), format="json")
    run_cycle_once()
    return Job.objects.prefetch_related("tasks__allocations__gpu", "tasks__node__leaf", "events").get(pk=response.json()["id"])


def test_a_job_answer_is_the_one_drf_would_build(cast, nodes):
    job = _placed_job(cast)
    request = APIRequestFactory().get("/")
    context = {"viewer": cast.ann, "request": request, "translated_from": "slurm", "warnings": ["--mail-user: ignored"]}
    assert job.tasks.count() == 2
    assert s.JobSubmitOut(job, context=context).data == _BuiltByDrf(job, context=context).data


def test_two_answers_made_at_once_keep_their_own_job_and_context(cast, nodes):
    job = _placed_job(cast)
    made = token_client(cast.ci_token).post("/api/v1/jobs", job_body(cast.org.team_a), format="json")
    other = Job.objects.get(pk=made.json()["id"])
    first = s.JobSubmitOut(job, context={"translated_from": "slurm", "warnings": ["a"]})
    second = s.JobSubmitOut(other, context={"translated_from": None, "warnings": []})
    assert first.fields["team"] is not second.fields["team"]
    second_data, first_data = second.data, first.data
    assert (first_data["id"], first_data["translated_from"], first_data["warnings"]) == (job.pk, "slurm", ["a"])
    assert (second_data["id"], second_data["translated_from"], second_data["warnings"]) == (other.pk, None, [])
    assert len(first_data["tasks"]) == 2 and second_data["tasks"] == []


def test_answers_built_in_parallel_threads_are_each_their_own(cast, nodes):
    client = token_client(cast.ci_token)
    ids = [client.post("/api/v1/jobs", job_body(cast.org.team_a, name=f"j{i}"), format="json").json()["id"] for i in range(4)]
    # Read whole here: the threads' own connections would not see this test's rows.
    jobs = list(Job.objects.select_related("team", "user").prefetch_related("tasks", "events").filter(pk__in=ids))
    wrong: list[str] = []

    def render(job: Job) -> None:
        for n in range(300):
            data = s.JobSubmitOut(job, context={"translated_from": f"{job.pk}-{n}", "warnings": []}).data
            if (data["name"], data["translated_from"]) != (job.name, f"{job.pk}-{n}"):
                wrong.append(f"{job.name}: {data['name']} {data['translated_from']}")

    threads = [threading.Thread(target=render, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_two_bodies_checked_at_once_keep_their_own_errors_and_values(cast):
    bad = s.JobSubmitIn(data={"name": "x", "team": "t", "command": "", "replicas": 0, "env": {"A": 1}})
    good = s.JobSubmitIn(data={"name": "y", "team": "u", "command": "true", "replicas": 3, "env": {"B": "2"}})
    assert good.is_valid() and not bad.is_valid()
    assert set(bad.errors) == {"command", "replicas"}
    assert (good.validated_data["replicas"], good.validated_data["env"]) == (3, {"B": "2"})
