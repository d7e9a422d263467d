"""Who may call the agent API: node tokens for their own node, enrolment tokens for register only."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.test import RequestFactory
from django.utils import timezone
from rest_framework.request import Request

from scheduling.models import EnrolmentToken, Node
from tenants.authentication import ApiTokenAuthentication
from tests.agent_api.conftest import AgentClient, issue_enrolment_token, issue_node_token

from .test_register import registration


def test_heartbeat_without_a_token_is_unauthorized(nodes: list[Node]) -> None:
    response = AgentClient(None).post("heartbeat", {})
    assert response.status_code == 401
    assert response.json() == {"code": "unauthorized"}


def test_unknown_node_token_is_unauthorized(nodes: list[Node]) -> None:
    assert AgentClient("ynd_not-a-real-token").post("heartbeat", {}).status_code == 401


def test_user_api_token_is_not_an_agent_token(nodes: list[Node]) -> None:
    assert AgentClient("ym_whatever").post("heartbeat", {}).status_code == 401


def test_enrolment_token_cannot_heartbeat(nodes: list[Node]) -> None:
    response = AgentClient(issue_enrolment_token()).post("heartbeat", {})
    assert response.status_code == 401
    assert response.json() == {"code": "unauthorized"}


def test_node_token_cannot_register(agent: AgentClient) -> None:
    assert agent.post("register", registration("node-new")).status_code == 401


def test_revoked_enrolment_token_cannot_register(db: None) -> None:
    raw = issue_enrolment_token(revoked_at=timezone.now())
    assert AgentClient(raw).post("register", registration("node-new")).status_code == 401


def test_expired_enrolment_token_cannot_register(db: None) -> None:
    raw = issue_enrolment_token(expires_at=timezone.now() - timedelta(seconds=1))
    assert AgentClient(raw).post("register", registration("node-new")).status_code == 401
    assert EnrolmentToken.objects.count() == 1 and not Node.objects.exists()


def test_get_is_not_allowed(agent: AgentClient) -> None:
    response = agent.http.get("/api/agent/v1/heartbeat", HTTP_AUTHORIZATION=f"Bearer {agent.token}")
    assert response.status_code == 405


def test_node_token_does_not_authenticate_on_the_user_api(nodes: list[Node]) -> None:
    raw = issue_node_token(nodes[0])
    django_request = RequestFactory().get("/api/v1/jobs/", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert ApiTokenAuthentication().authenticate(Request(django_request)) is None


def test_agent_endpoints_are_not_in_the_user_schema(client: Any, db: None) -> None:
    response = client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    assert "/api/agent/" not in response.content.decode()
