"""Property-based fuzzing of the agent API from its own OpenAPI document (GET /api/agent/v1/schema, made
from the declarations the server validates with): no body makes a 5xx, every answer is one the document
lists, in the shape it gives, and a body the document calls invalid is refused.

Bounded for CI (a fixed number of examples per operation, derandomized). Requests go through the real
WSGI app with a node token (an enrolment token for register), positive and negative data.
"""

from __future__ import annotations

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from portal.wsgi import application
from scheduling.agent.views import agent_openapi
from scheduling.models import Node
from tests.agent_api.conftest import issue_enrolment_token, issue_node_token
from tests.factories import make_cluster

schema = schemathesis.openapi.from_dict(agent_openapi())
schema.app = application

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance, negative_data_rejection]


@pytest.fixture
def _keep_the_test_transaction():
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def tokens(settings, _keep_the_test_transaction) -> dict[str, str]:
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    node = make_cluster(nodes=2)[0]
    return {"node": issue_node_token(node), "enrolment": issue_enrolment_token()}


@schema.parametrize()
@hsettings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_agent_body_makes_a_server_error_or_an_undocumented_answer(case, tokens):
    token = tokens["enrolment"] if case.path.endswith("/register") else tokens["node"]
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)


def test_the_fuzzer_reaches_the_views_authenticated(tokens):
    response = (
        schema["/heartbeat"]["POST"]
        .Case(body={"gpus": [], "tasks": []})
        .call(headers={"Authorization": f"Bearer {tokens['node']}"})
    )
    assert response.status_code == 200 and Node.objects.filter(last_heartbeat__isnull=False).exists()
