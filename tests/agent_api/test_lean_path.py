"""The agent API past the middleware that serves people (portal.agent_middleware.AgentApiMiddleware): the
same answers as through the whole chain, still authenticated by the token alone, still behind the Host
check, the 503 of a database error and the chain's 404 for what no agent view serves."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.test import Client, override_settings

from scheduling.models import Node
from tests.agent_api.conftest import API, AgentClient, heartbeat_body
from tests.factories import make_user

LEAN = "portal.agent_middleware.AgentApiMiddleware"


def whole_chain() -> Any:
    return override_settings(MIDDLEWARE=[m for m in settings.MIDDLEWARE if m != LEAN])


def answer(client: Client, method: str, path: str, body: Any = None, **headers: Any) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body) if body is not None else ""
    response = getattr(client, method)(API + path, data=data, content_type="application/json", **headers)
    headers = dict(response.headers)
    # The length is the body's (and the body's clock reading, portal_time, differs from answer to answer).
    assert int(headers.pop("Content-Length")) == len(response.content)
    content = json.loads(response.content) if response.content else None
    if isinstance(content, dict):
        content.pop("portal_time", None)
    return response.status_code, headers, content


CALLS = [
    ("post", "heartbeat", heartbeat_body(), True),  # 200
    ("post", "heartbeat", heartbeat_body(), False),  # no token: 401
    ("post", "heartbeat", {"tasks": "many"}, True),  # 400
    ("get", "heartbeat", None, True),  # 405
    ("post", "drain", {"reason": "disk"}, True),  # another agent view
    ("post", "tasks/999999/status", {"attempt": 1, "state": "running"}, True),  # 404 of the view
    ("get", "schema", None, False),
]


@pytest.mark.parametrize(("method", "path", "body", "token"), CALLS, ids=[f"{m} {p} {i}" for i, (m, p, _, _) in enumerate(CALLS)])
def test_an_agent_call_answers_as_through_the_whole_chain(
    agent: AgentClient, method: str, path: str, body: Any, token: bool
) -> None:
    headers = {"HTTP_AUTHORIZATION": f"Bearer {agent.token}"} if token else {}
    lean = answer(Client(), method, path, body, **headers)
    Node.objects.update(state="READY", state_reason="", hold_reason="")  # the drain's change, undone for the second call
    with whole_chain():
        chain = answer(Client(), method, path, body, **headers)
    assert lean == chain
    assert lean[1]["X-Frame-Options"] == "DENY"


def test_a_signed_in_browser_does_not_speak_for_a_node(db: None, agent: AgentClient) -> None:
    # Agent calls are authenticated by their token alone: a session cookie (even an admin's) opens nothing,
    # is not read, and is not refreshed; CSRF is not what refuses them (the token is).
    browser = Client(enforce_csrf_checks=True)
    admin = make_user("root")
    admin.is_superuser = admin.is_staff = True
    admin.save()
    browser.force_login(admin)
    response = browser.post(API + "heartbeat", data=json.dumps(heartbeat_body()), content_type="application/json")
    assert response.status_code == 401 and response.json()["code"] == "unauthorized"
    assert "Set-Cookie" not in response.headers and "Vary" not in response.headers
    assert not hasattr(response.wsgi_request, "user") and not hasattr(response.wsgi_request, "session")


def test_a_host_not_allowed_is_refused_on_the_agent_api(agent: AgentClient) -> None:
    with override_settings(ALLOWED_HOSTS=["portal.example"]):
        refused = agent.http.post(
            API + "heartbeat",
            data=json.dumps(heartbeat_body()),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {agent.token}",
            HTTP_HOST="elsewhere.example",
        )
        allowed = agent.http.post(
            API + "heartbeat",
            data=json.dumps(heartbeat_body()),
            content_type="application/json",
            HTTP_AUTHORIZATION=f"Bearer {agent.token}",
            HTTP_HOST="portal.example",
        )
    assert (refused.status_code, allowed.status_code) == (400, 200)


def test_an_address_no_agent_view_serves_gets_the_whole_chains_answer(db: None) -> None:
    lean = Client().get(API + "heartbeat/")
    with whole_chain():
        chain = Client().get(API + "heartbeat/")
    assert lean.status_code == chain.status_code == 404
    assert lean.headers["Content-Type"] == chain.headers["Content-Type"]
    # The page's CSRF token is new each time; that it has one shows the chain's middleware ran.
    assert lean.cookies.keys() == chain.cookies.keys() == {settings.CSRF_COOKIE_NAME}


@pytest.fixture
def row_locked(transactional_db: None, agent: AgentClient) -> Iterator[None]:
    """The agent's node row locked by another session (an admin's long transaction), and a short
    statement_timeout on the portal's: its heartbeat's liveness UPDATE waits, then is cancelled."""
    params = connection.get_connection_params()
    other = psycopg.connect(**{k: v for k, v in params.items() if k in ("dbname", "user", "host", "port", "password")})
    node_id = Node.objects.exclude(token_hash="").order_by("pk").values_list("pk", flat=True).first()
    other.execute("SELECT 1 FROM scheduling_node WHERE id = %s FOR UPDATE", [node_id])
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '300ms'")
    try:
        yield
    finally:
        other.rollback()
        other.close()
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")


def test_a_database_error_in_an_agent_view_is_answered_unavailable(row_locked: None, agent: AgentClient) -> None:
    # A real error from PostgreSQL (the statement cancelled at its timeout is an OperationalError), raised
    # in the view: FaultAnswersMiddleware's answer, as through the whole chain, never a 500.
    response = agent.post("heartbeat", heartbeat_body())
    assert response.status_code == 503
    assert response.json()["code"] == "unavailable" and "Retry-After" in response.headers
