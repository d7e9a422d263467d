"""The API contract the security review checked: a batch job needs a command, a GPU type the cluster lacks
is an error on gpu_type, replays of an Idempotency-Key answer 200 even when they race, and the per-token
rate limit is announced in RateLimit-* headers."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests
from django.core.cache import cache
from drf_spectacular.generators import SchemaGenerator

from scheduling.models import Job
from tests.api.conftest import job_body, session_client, token_client

pytestmark = pytest.mark.django_db


def test_a_batch_job_without_a_command_is_refused_on_that_field(cast, nodes):
    body = job_body(cast.org.team_a)
    del body["command"]
    response = token_client(cast.ann_token).post("/api/v1/jobs", body, format="json")
    assert response.status_code == 400
    assert "needs a command" in response.json()["fields"]["command"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize("command", ["", "   \n"])
def test_a_blank_command_is_refused_on_that_field(cast, nodes, command):
    response = token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a, command=command), format="json")
    assert response.status_code == 400
    assert list(response.json()["fields"]) == ["command"]
    assert not Job.objects.exists()


def test_a_notebook_needs_no_command(cast, nodes):
    response = token_client(cast.ann_token).post("/api/v1/notebooks", {"name": "nb", "team": cast.org.team_a.slug}, format="json")
    assert response.status_code == 201, response.json()


def test_an_unknown_gpu_type_is_an_error_on_gpu_type(cast, nodes):
    response = token_client(cast.ann_token).post("/api/v1/jobs", job_body(cast.org.team_a, gpu_type="B200"), format="json")
    body = response.json()
    assert response.status_code == 400
    assert body["code"] == "never_runnable"  # what `yard submit` exits 121 for
    assert list(body["fields"]) == ["gpu_type"]
    assert "no B200 GPUs" in body["fields"]["gpu_type"][0] and "H100" in body["fields"]["gpu_type"][0]
    assert not Job.objects.exists()


def test_the_preview_of_an_unknown_gpu_type_is_a_verdict(cast, nodes):
    response = token_client(cast.ann_token).post(
        "/api/v1/jobs/preview", job_body(cast.org.team_a, gpu_type="B200"), format="json"
    )
    assert response.status_code == 200
    assert response.json()["ok"] is False and "no B200 GPUs" in response.json()["verdict"]


def test_a_replayed_key_answers_200_with_the_same_job(cast, nodes):
    client = token_client(cast.ci_token)
    first = client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json", HTTP_IDEMPOTENCY_KEY="pipeline-7")
    again = client.post("/api/v1/jobs", job_body(cast.org.team_a), format="json", HTTP_IDEMPOTENCY_KEY="pipeline-7")
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.json()["id"] == again.json()["id"]


def test_six_concurrent_posts_with_one_key_make_one_job_one_201_and_five_200(cast, nodes, live_server):
    barrier = threading.Barrier(6)
    answers: list[tuple[int, Any]] = []
    lock = threading.Lock()

    def post() -> None:
        barrier.wait()
        response = requests.post(
            f"{live_server.url}/api/v1/jobs",
            json=job_body(cast.org.team_a),
            headers={"Authorization": f"Bearer {cast.ci_token}", "Idempotency-Key": "race-1"},
            timeout=60,
        )
        with lock:
            answers.append((response.status_code, response.json().get("id")))

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    codes = sorted(code for code, _ in answers)
    assert codes == [200, 200, 200, 200, 200, 201], answers
    assert len({job for _, job in answers}) == 1
    assert Job.objects.filter(idempotency_key="race-1").count() == 1


def test_token_requests_carry_ratelimit_headers_and_the_429_says_when(cast, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "3/minute"}}
    cache.clear()
    client = token_client(cast.ann_token)
    seen = [client.get("/api/v1/me") for _ in range(3)]
    assert [r.status_code for r in seen] == [200, 200, 200]
    assert [r["RateLimit-Remaining"] for r in seen] == ["2", "1", "0"]
    assert all(r["RateLimit-Limit"] == "3" and r["RateLimit-Policy"] == "3;w=60" for r in seen)
    assert 0 < int(seen[-1]["RateLimit-Reset"]) <= 60
    refused = client.get("/api/v1/me")
    assert refused.status_code == 429 and refused.json()["code"] == "throttled"
    assert refused["RateLimit-Remaining"] == "0" and 0 < int(refused["Retry-After"]) <= 60


def test_sessions_are_not_throttled_and_get_no_ratelimit_headers(cast, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "1/minute"}}
    client = session_client(cast.ann)
    answers = [client.get("/api/v1/me") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert "RateLimit-Limit" not in answers[0]


def test_the_default_rate_suits_a_one_second_poll_loop():
    import portal.settings as configured

    rate = configured.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["token"]  # as the environment left it
    assert rate == "120/minute"


@pytest.mark.parametrize(("value", "rate"), [("120/minute", "120/minute"), ("10/s", "10/s"), ("off", None)])
def test_the_throttle_setting_reads_rates_and_off(value, rate):
    from portal.settings import _token_throttle

    assert _token_throttle(value) == rate


@pytest.mark.parametrize("value", ["fast", "0/minute", "12/fortnight", "-1/minute"])
def test_a_bad_throttle_setting_stops_startup_naming_it(value):
    from portal.env import ImproperlyConfiguredEnv
    from portal.settings import _token_throttle

    with pytest.raises(ImproperlyConfiguredEnv, match="YARD_TOKEN_THROTTLE"):
        _token_throttle(value)


@pytest.mark.parametrize("team", ["\x00", "x" * 101])
def test_a_fairshare_team_no_slug_could_be_is_a_documented_400(cast, team):
    # Seen in a schemathesis run: ?team=%00 answered a 400 the schema did not list.
    response = token_client(cast.ann_token).get("/api/v1/fairshare", {"team": team})
    assert response.status_code == 400
    assert response.json() == {"detail": "team must be a team id or slug"}
    documented = SchemaGenerator().get_schema(request=None, public=True)["paths"]["/api/v1/fairshare"]["get"]["responses"]
    assert "400" in documented
