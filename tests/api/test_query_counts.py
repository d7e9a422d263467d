"""The jobs list costs the same number of queries for 10 jobs as for 50."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.api.conftest import token_client
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
