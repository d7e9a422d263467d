"""Property-based fuzzing of every /api/v1/ operation from the OpenAPI schema: no input makes a 5xx,
and every answer has a documented status and matches its documented schema.

The schema is generated in-process (what /api/schema/ serves) and requests go through the real
WSGI app, authenticated with a team lead's token, against a small cluster with a few jobs.
"""

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

from portal.wsgi import application
from scheduling.models import Task, TaskLogChunk
from scheduling.states import JobState
from tenants.models import Role
from tenants.services import token_create_personal
from tests.factories import make_cluster, make_job, make_org, make_user

schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = application
schema = schema.include(path_regex=r"^/api/v1/")

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture
def _keep_the_test_transaction():
    # The real WSGI handler closes "old" connections at each request's start and end, which would
    # close the connection holding the test's transaction; Django's test client does the same.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def bearer(settings, _keep_the_test_transaction):
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    org = make_org()
    lead = make_user("lea", unit=org.team_a, role=Role.TEAM_LEAD)
    node = make_cluster(nodes=4)[0]
    for state in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETED):
        job = make_job(team=org.team_a, user=lead, state=state, started_at=timezone.now())
        task = Task.objects.create(job=job, attempt=1, rank=0, node=node)
        TaskLogChunk.objects.create(task=task, offset=0, data="hello\nworld\n")
    make_job(team=org.team_c, user=make_user("bea", unit=org.team_c))
    return {"Authorization": f"Bearer {token_create_personal(user=lead, name='fuzz', expires_at=None).raw}"}


@schema.parametrize()
@hsettings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_input_makes_a_server_error_or_an_undocumented_answer(case, bearer):
    case.call_and_validate(headers=bearer, checks=[not_a_server_error, status_code_conformance, response_schema_conformance])


def test_fuzzing_requests_reach_the_views_authenticated(bearer):
    response = schema["/api/v1/me"]["GET"].Case().call(headers=bearer)
    assert response.status_code == 200 and response.json()["username"] == "lea"
