"""POST /api/v1/jobs with ``array``: one request, N jobs; listing, reading and cancelling arrays; bad input.
Real PostgreSQL, the DRF test client, a CI token as a pipeline has."""

from __future__ import annotations

import pytest

from scheduling.models import Job, JobArray, JobEvent
from scheduling.states import JobState
from tenants.models import AuditEntry
from tests.api.conftest import job_body, token_client

pytestmark = pytest.mark.django_db


def _array(cast, nodes, array: str, *, token: str | None = None, **kw):
    body = job_body(cast.org.team_a, replicas=1, gpus_per_replica=1, array=array, **kw)
    return token_client(token or cast.ci_token).post("/api/v1/jobs", body, format="json")


def test_one_post_makes_a_job_per_index_with_the_array_id_and_index(cast, nodes):
    response = _array(cast, nodes, "1,3,5-7%2")
    assert response.status_code == 201, response.json()
    body = response.json()
    tasks = list(Job.objects.filter(array_id=body["id"]).order_by("array_index"))
    assert [t.array_index for t in tasks] == [1, 3, 5, 6, 7]
    assert body["task_count"] == 5 and body["max_running"] == 2 and body["array"] == "1,3,5-7%2"
    assert body["id"] == tasks[0].pk == min(t.pk for t in tasks)
    assert body["states"] == {"PENDING": 5}
    assert tasks[3].env["YARD_ARRAY_TASK_ID"] == "6"
    assert tasks[3].env["YARD_ARRAY_JOB_ID"] == str(body["id"])
    assert (tasks[0].env["YARD_ARRAY_TASK_COUNT"], tasks[0].env["YARD_ARRAY_TASK_MIN"], tasks[0].env["YARD_ARRAY_TASK_MAX"]) == (
        "5",
        "1",
        "7",
    )
    assert tasks[0].env["YARD_ARRAY_TASK_STEP"] == "1"
    # each its own job: own checkpoint directory, own submit event; one audit entry for the array
    assert len({t.checkpoint_dir for t in tasks}) == 5
    assert JobEvent.objects.filter(job__in=tasks, to_state=JobState.PENDING).count() == 5
    assert AuditEntry.objects.filter(action="job.submit_array").count() == 1
    assert AuditEntry.objects.filter(action="job.submit").count() == 0
    # beyond the limit a task says why it waits from the start
    assert tasks[2].pending_reason.startswith("JobArrayTaskLimit")
    assert not tasks[1].pending_reason.startswith("JobArrayTaskLimit")


def test_a_stepped_range_sets_the_step(cast, nodes):
    body = _array(cast, nodes, "0-9:3").json()
    task = Job.objects.get(array_id=body["id"], array_index=9)
    assert body["task_count"] == 4
    assert task.env["YARD_ARRAY_TASK_STEP"] == "3"
    assert JobArray.objects.get(pk=body["id"]).max_running is None


def test_a_given_checkpoint_directory_gets_one_folder_per_index(cast, nodes):
    team_dir = f"{__import__('django.conf').conf.settings.YARD['CHECKPOINT_ROOT']}/{cast.org.team_a.slug}"
    body = _array(cast, nodes, "0-2", checkpoint_dir=f"{team_dir}/sweep").json()
    dirs = list(Job.objects.filter(array_id=body["id"]).order_by("array_index").values_list("checkpoint_dir", flat=True))
    assert dirs == [f"{team_dir}/sweep/0", f"{team_dir}/sweep/1", f"{team_dir}/sweep/2"]


@pytest.mark.parametrize(
    ("array", "says"),
    [
        ("0-", "is not an index or a range"),
        ("5-1", "a range runs upwards: give 1-5"),
        ("0-9%0", "%0 would run no task"),
        ("0-10000", "YARD_MAX_ARRAY_SIZE"),
        ("0-9:0", "the step after : is at least 1"),
        ("a-b", "is not an index or a range"),
        ("0-9%x", "after % give how many"),
    ],
)
def test_bad_indices_are_a_400_saying_what_to_change(cast, nodes, array, says):
    response = _array(cast, nodes, array)
    assert response.status_code == 400, response.json()
    assert says in " ".join(response.json()["fields"]["array"])
    assert not Job.objects.exists()


def test_the_maximum_array_size_is_the_deployments(cast, nodes, settings):
    settings.YARD = {**settings.YARD, "MAX_ARRAY_SIZE": 100}
    assert _array(cast, nodes, "0-99").status_code == 201
    response = _array(cast, nodes, "0-100")
    assert response.status_code == 400
    assert "from 0 to 99" in response.json()["fields"]["array"][0]


def test_the_admission_check_refuses_the_whole_array_once(cast, nodes):
    response = _array(cast, nodes, "0-99", gpu_type="A100")
    assert response.status_code == 400
    assert response.json()["code"] == "never_runnable"
    assert not Job.objects.exists()


def test_another_tenants_team_is_refused_for_the_whole_array(cast, nodes):
    body = job_body(cast.org.team_c, replicas=1, gpus_per_replica=1, array="0-9")
    response = token_client(cast.ann_token).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 400
    assert not Job.objects.exists()


def test_the_array_variables_are_the_arrays_own(cast, nodes):
    response = _array(cast, nodes, "0-3", env={"YARD_ARRAY_TASK_ID": "7"})
    assert response.status_code == 400
    assert "YARD_ARRAY_TASK_ID" in response.json()["fields"]["env"][0]


def test_an_idempotency_key_makes_one_array_and_a_replay_answers_200(cast, nodes):
    client = token_client(cast.ci_token)
    body = job_body(cast.org.team_a, replicas=1, gpus_per_replica=1, array="0-49%5")
    first = client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    again = client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]
    assert Job.objects.count() == 50
    other = client.post("/api/v1/jobs", {**body, "array": "0-50%5"}, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    assert other.status_code == 409
    single = client.post("/api/v1/jobs", {**body, "array": ""}, format="json", HTTP_IDEMPOTENCY_KEY="sweep-1")
    assert single.status_code == 409
    assert Job.objects.count() == 50


def test_tasks_are_listed_by_array_and_the_array_reads_as_one(cast, nodes):
    first = _array(cast, nodes, "0-4").json()
    _array(cast, nodes, "0-2")
    client = token_client(cast.ann_token)
    listed = client.get("/api/v1/jobs", {"array": first["id"]}).json()["results"]
    assert sorted(j["array_index"] for j in listed) == [0, 1, 2, 3, 4]
    assert {j["array_id"] for j in listed} == {first["id"]}
    whole = client.get(f"/api/v1/arrays/{first['id']}").json()
    assert whole["states"] == {"PENDING": 5} and whole["array"] == "0-4" and whole["team"]["slug"] == cast.org.team_a.slug


def test_cancelling_the_array_cancels_every_task_and_one_task_alone_is_one(cast, nodes):
    body = _array(cast, nodes, "0-9", token=cast.ann_token).json()
    client = token_client(cast.ann_token)
    one = Job.objects.get(array_id=body["id"], array_index=3)
    assert client.post(f"/api/v1/jobs/{one.pk}/cancel").json()["state"] == "CANCELLED"
    assert Job.objects.filter(array_id=body["id"], state=JobState.PENDING).count() == 9
    response = client.post(f"/api/v1/arrays/{body['id']}/cancel")
    assert response.status_code == 200, response.json()
    assert response.json()["cancelled"] == 9
    assert response.json()["states"] == {"CANCELLED": 10}
    assert JobEvent.objects.filter(job__array_id=body["id"], to_state=JobState.CANCELLED).count() == 10


def test_another_tenant_cannot_read_or_cancel_an_array(cast, nodes):
    body = _array(cast, nodes, "0-3").json()
    client = token_client(cast.bea_token)
    assert client.get(f"/api/v1/arrays/{body['id']}").status_code == 404
    assert client.post(f"/api/v1/arrays/{body['id']}/cancel").status_code == 404
    assert not Job.objects.filter(state=JobState.CANCELLED).exists()


def test_a_task_that_is_not_the_first_is_no_array_id(cast, nodes):
    body = _array(cast, nodes, "0-3").json()
    second = Job.objects.get(array_id=body["id"], array_index=1)
    assert token_client(cast.ann_token).get(f"/api/v1/arrays/{second.pk}").status_code == 404


def test_without_ids_from_a_sequence_the_tasks_come_out_the_same(cast, nodes, monkeypatch):
    """SQLite (the demo) hands out ids only as it inserts: the ORM's path, which must make the same rows."""
    from scheduling.services import arrays

    fast = _array(cast, nodes, "2-6:2%1", env={"SEED": "1"}).json()
    monkeypatch.setattr(arrays, "_reserve_ids", lambda count: None)
    slow = _array(cast, nodes, "2-6:2%1", env={"SEED": "1"}).json()

    def rows(array_id: int) -> list[tuple]:
        out = []
        for job in Job.objects.filter(array_id=array_id).order_by("array_index"):
            env = {k: v for k, v in job.env.items() if k != "YARD_ARRAY_JOB_ID"}
            reason = job.pending_reason.replace(str(array_id), "ID")
            out.append((job.array_index, env, reason, job.checkpoint_dir.rsplit("/", 1)[-1] == str(job.pk), job.state))
        return out

    assert rows(fast["id"]) == rows(slow["id"])
    assert Job.objects.get(pk=slow["id"]).env["YARD_ARRAY_JOB_ID"] == str(slow["id"])
    assert JobEvent.objects.filter(job__array_id=slow["id"]).count() == 3
