"""The jobs list costs the same number of queries for 10 jobs as for 50."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.conftest import job_body, token_client
from tests.factories import make_job

pytestmark = pytest.mark.django_db


def _queries_for_list(cast, jobs: int) -> int:
    for _ in range(jobs - cast.org.team_a.jobs.count()):
        make_job(team=cast.org.team_a, user=cast.ann)
    client = token_client(cast.ann_token)
    client.get("/api/v1/jobs")  # warm the token's last-used stamp
    with CaptureQueriesContext(connection) as ctx:
        response = client.get("/api/v1/jobs?page_size=100")
    assert len(response.json()["results"]) == jobs
    return len(ctx.captured_queries)


def test_jobs_list_query_count_does_not_grow_with_the_jobs(cast):
    assert _queries_for_list(cast, 10) == _queries_for_list(cast, 50)


def _submit_queries(cast, *, queued: int, token: str = "", **body_changes) -> tuple[int, int]:
    """(status, queries) of one JSON submission with a fresh Idempotency-Key, with `queued` more jobs pending first."""
    for _ in range(queued):
        make_job(team=cast.org.team_a, user=cast.ann)
    client = token_client(token or cast.ci_token)
    body = job_body(cast.org.team_a, replicas=1, gpus_per_replica=1, **body_changes)
    client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="warm")  # the token's last-used stamp
    with CaptureQueriesContext(connection) as ctx:
        response = client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY=f"k-{queued}")
    return response.status_code, len(ctx.captured_queries)


# What one submission reads and writes (issue 24: a CI burst must not cost more than this each):
# token; memberships with their units (the team is found among them); BEGIN; the Idempotency-Key lock;
# the key's job, if any; the topology key (admission's capacity); the team's quota chain (one LEFT
# JOIN); the job, its checkpoint directory named by its id, its event and its audit entry in one
# statement (issue 29: was a savepoint, four statements and its release); COMMIT.
SUBMISSION_QUERIES = 9


def test_a_submission_costs_a_fixed_number_of_queries(cast, nodes):
    assert _submit_queries(cast, queued=0) == (201, SUBMISSION_QUERIES)


def test_a_submission_costs_the_same_with_a_long_queue(cast, nodes):
    assert _submit_queries(cast, queued=200) == (201, SUBMISSION_QUERIES)


def test_a_replay_of_a_key_answers_200_and_writes_nothing(cast, nodes):
    client = token_client(cast.ci_token)
    body = job_body(cast.org.team_a, replicas=1, gpus_per_replica=1)
    first = client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    with CaptureQueriesContext(connection) as ctx:
        again = client.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert not [q for q in ctx.captured_queries if q["sql"].startswith(("INSERT", "UPDATE"))]
