"""The jobs endpoints: submit, idempotency, errors, list filters and pages, detail, cancel, logs."""

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Task, TaskLogChunk
from scheduling.services import task_mark_running
from scheduling.states import JobState
from tenants.models import AuditEntry
from tests.api.conftest import job_body, session_client, token_client
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def test_submit_with_a_token_creates_a_pending_job(cast, nodes):
    response = token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a), format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["state"] == "PENDING" and body["team"]["slug"] == cast.org.team_a.slug
    assert body["events"][0]["to_state"] == "PENDING"


def test_same_idempotency_key_posted_twice_creates_one_job(cast, nodes):
    client = token_client(cast.ci_token)
    first = client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json", HTTP_IDEMPOTENCY_KEY="build-77")
    second = client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json", HTTP_IDEMPOTENCY_KEY="build-77")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert Job.objects.count() == 1


def test_same_idempotency_key_with_another_body_is_a_409_with_a_message(cast, nodes):
    client = token_client(cast.ci_token)
    client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json", HTTP_IDEMPOTENCY_KEY="build-77")
    response = client.post("/api/v1/jobs", job_body(cast.org.team_a, replicas=1), format="json", HTTP_IDEMPOTENCY_KEY="build-77")
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_conflict" and "different spec" in response.json()["message"]
    assert Job.objects.count() == 1


def test_bad_fields_answer_with_a_code_and_a_message_per_field(cast, nodes):
    response = token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a, replicas=0, tier=7), format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid" and set(body["fields"]) == {"replicas", "tier"}


def test_a_job_that_can_never_run_is_refused_with_the_reason(cast, nodes):
    response = token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a, gpu_type="B200"), format="json")
    assert response.status_code == 400
    assert "never run" in response.json()["message"]


def test_another_tenants_team_is_refused_like_a_missing_one(cast, nodes):
    client = token_client(cast.ann_token)
    other = client.post("/api/v1/jobs", job_body(cast.org.team_c), format="json").json()
    missing = client.post("/api/v1/jobs", {**job_body(cast.org.team_c), "team": "no-such-team"}, format="json").json()
    assert other["fields"]["team"] == missing["fields"]["team"]


def test_list_shows_only_visible_jobs_and_filters_by_state(cast):
    mine = make_job(team=cast.org.team_a, user=cast.ann)
    make_job(team=cast.org.team_a, user=cast.amy, state=JobState.COMPLETED)
    make_job(team=cast.org.team_c, user=cast.bea)
    client = token_client(cast.ann_token)
    assert {j["team"]["slug"] for j in client.get("/api/v1/jobs").json()["results"]} == {cast.org.team_a.slug}
    pending = client.get("/api/v1/jobs?state=PENDING,STARTING").json()["results"]
    assert [j["id"] for j in pending] == [mine.pk]


def test_list_filters_by_team_user_tier_and_since(cast):
    make_job(team=cast.org.team_a, user=cast.ann, tier=3)
    amy_job = make_job(team=cast.org.team_b, user=cast.amy, tier=2)
    client = session_client(cast.admin)
    assert [j["id"] for j in client.get(f"/api/v1/jobs?team={cast.org.team_b.slug}").json()["results"]] == [amy_job.pk]
    assert [j["id"] for j in client.get("/api/v1/jobs?user=amy&tier=2").json()["results"]] == [amy_job.pk]
    later = (timezone.now() + timezone.timedelta(hours=1)).isoformat()
    assert client.get("/api/v1/jobs", {"since": later}).json()["results"] == []


def test_list_pages_with_a_cursor(cast):
    for _ in range(5):
        make_job(team=cast.org.team_a, user=cast.ann)
    client = token_client(cast.ann_token)
    first = client.get("/api/v1/jobs?page_size=3").json()
    second = client.get(first["next"]).json()
    ids = [j["id"] for j in first["results"] + second["results"]]
    assert len(ids) == 5 and ids == sorted(ids, reverse=True) and second["next"] is None


def test_detail_has_tasks_placement_and_events(cast, nodes):
    job_id = token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a), format="json").json()["id"]
    run_cycle_once()
    body = token_client(cast.ann_token).get(f"/api/v1/jobs/{job_id}").json()
    assert body["state"] == "STARTING" and body["locality"]
    assert [t["rank"] for t in body["tasks"]] == [0, 1]
    assert all(len(t["gpu_indexes"]) == 8 for t in body["tasks"])
    assert "placed on" in body["events"][-1]["reason"]


def test_cancel_by_the_owner_cancels_and_is_audited_once(cast, nodes):
    client = token_client(cast.ann_token)
    job_id = client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json").json()["id"]
    response = client.post(f"/api/v1/jobs/{job_id}/cancel")
    assert response.status_code == 200 and response.json()["state"] == "CANCELLED"
    assert AuditEntry.objects.filter(action="job.cancel", object_id=str(job_id)).count() == 1


def test_a_teammate_may_see_but_not_cancel(cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client = session_client(cast.amy)
    assert client.get(f"/api/v1/jobs/{job.pk}").status_code == 200
    response = client.post(f"/api/v1/jobs/{job.pk}/cancel")
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"


def test_the_team_lead_may_cancel_a_members_job(cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    assert session_client(cast.lead).post(f"/api/v1/jobs/{job.pk}/cancel").json()["state"] == "CANCELLED"


@pytest.fixture
def logged(cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, state=JobState.RUNNING)
    from tests.factories import make_cluster

    node = make_cluster(nodes=1)[0]
    task = Task.objects.create(job=job, attempt=1, rank=0, node=node)
    TaskLogChunk.objects.create(task=task, offset=0, data="line 1\nline 2\n")
    TaskLogChunk.objects.create(task=task, offset=14, data="line 3\n")
    return job


def test_logs_from_an_offset_give_the_rest_and_the_next_offset(cast, logged):
    body = token_client(cast.ann_token).get(f"/api/v1/jobs/{logged.pk}/logs?offset=7").json()
    assert body["text"] == "line 2\nline 3\n" and body["next_offset"] == 21
    again = token_client(cast.ann_token).get(f"/api/v1/jobs/{logged.pk}/logs?offset=21").json()
    assert again["text"] == "" and again["next_offset"] == 21


def test_logs_tail_gives_the_last_lines(cast, logged):
    body = token_client(cast.ann_token).get(f"/api/v1/jobs/{logged.pk}/logs?tail=2").json()
    assert body["text"] == "line 2\nline 3\n" and body["next_offset"] == 21


def test_notebook_url_is_the_portals_proxy_for_those_who_may_open_it(cast, nodes):
    client = token_client(cast.ann_token)
    created = client.post("/api/v1/notebooks", {"name": "nb", "team": cast.org.team_a.slug, "gpus": 1}, format="json")
    assert created.status_code == 201, created.json()
    run_cycle_once()
    task = Task.objects.get(job_id=created.json()["id"])
    assert client.get(f"/api/v1/notebooks/{task.job_id}").json()["notebook_url"] is None  # not started
    task_mark_running(task=task, pid=1, started_at=timezone.now(), notebook_url="https://n/lab?token=s3cret")
    Task.objects.filter(pk=task.pk).update(notebook_kernel_busy=False)  # its server answers the agent's probe
    url = client.get(f"/api/v1/notebooks/{task.job_id}").json()["notebook_url"]
    assert url == f"http://testserver/notebooks/{task.job_id}/lab/" and "s3cret" not in url
    assert session_client(cast.lead).get(f"/api/v1/notebooks/{task.job_id}").json()["notebook_url"] == url
    assert session_client(cast.amy).get(f"/api/v1/notebooks/{task.job_id}").json()["notebook_url"] is None
    assert client.get(f"/api/v1/jobs/{task.job_id}").status_code == 404  # a notebook is not under /jobs


def test_team_quota_shows_guaranteed_used_and_borrowed(cast, nodes):
    token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a), format="json")
    run_cycle_once()
    body = token_client(cast.ann_token).get(f"/api/v1/teams/{cast.org.team_a.pk}/quota").json()
    assert body["quotas"] == [{"gpu_type": "H100", "guaranteed": 16, "limit": 32, "used": 16, "borrowed": 0, "reclaimable": 0}]


def test_me_names_the_user_teams_and_how_they_authenticated(cast):
    body = token_client(cast.ci_token).get("/api/v1/me").json()
    assert body["username"] == f"svc-{cast.org.team_a.slug}" and body["auth"] == "service token"
    assert [t["slug"] for t in body["teams"]] == [cast.org.team_a.slug]


def test_token_requests_are_throttled_at_the_token_rate(cast, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "3/minute"}}
    client = token_client(cast.ann_token)
    codes = [client.get("/api/v1/me").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert client.get("/api/v1/me").json()["code"] == "throttled"


def test_sessions_are_not_throttled_at_the_token_rate(cast, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "3/minute"}}
    client = session_client(cast.ann)
    assert {client.get("/api/v1/me").status_code for _ in range(4)} == {200}


def test_no_credentials_is_a_401_in_the_error_shape(db):
    from rest_framework.test import APIClient

    body = APIClient().get("/api/v1/jobs")
    assert body.status_code in (401, 403) and body.json()["code"] == "not_authenticated"


def test_a_jobs_leaf_locality_is_kept_shown_and_planned_with(cast, nodes):
    from scheduling.core.types import LeafLocality
    from scheduling.selectors import snapshot_build

    client = token_client(cast.ann_token)
    body = client.post("/api/v1/jobs", job_body(cast.org.team_a, leaf_locality="required"), format="json").json()
    assert body["leaf_locality"] == "required"
    assert Job.objects.get(pk=body["id"]).leaf_locality == "required"
    (pending,) = [p for p in snapshot_build(now=timezone.now()).pending if p.job_id == str(body["id"])]
    assert pending.locality == LeafLocality.REQUIRED
    default = client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json").json()
    assert default["leaf_locality"] == "auto"
    bad = client.post("/api/v1/jobs", job_body(cast.org.team_a, leaf_locality="nearby"), format="json")
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"leaf_locality"}
