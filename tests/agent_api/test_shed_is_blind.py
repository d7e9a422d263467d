"""A heartbeat the portal sheds (503/429 "overloaded") is time the portal counts as blind, as during a
database outage: an agent that is told "overloaded" does not fence, so the portal must not count that
time as the node's silence either (docs/agent-api.md, *What the portal counts as silence*)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import RequestFactory
from django.utils import timezone

from portal import middleware
from portal.middleware import BLIND_LATEST_KEY, BLIND_SINCE_KEY, overloaded
from scheduling.agent.liveness import nodes_check
from scheduling.models import Node, NodeState


@pytest.fixture(autouse=True)
def _no_old_streak() -> None:
    cache.delete_many([BLIND_SINCE_KEY, BLIND_LATEST_KEY])


def _shed_heartbeat(status: int = 503) -> dict[str, object]:
    response = overloaded(RequestFactory().post("/api/agent/v1/heartbeat"), retry_after_s=2, status=status)
    assert response.status_code == status
    assert 2 <= int(response["Retry-After"]) <= 3
    body: dict[str, object] = json.loads(response.content)
    return body


@pytest.mark.parametrize("status", [503, 429])
def test_a_shed_agent_call_is_recorded_as_blind_before_it_says_overloaded(db: None, status: int) -> None:
    assert _shed_heartbeat(status)["code"] == "overloaded"
    assert cache.get(BLIND_SINCE_KEY) is not None and cache.get(BLIND_LATEST_KEY) is not None


def test_a_shed_user_call_records_nothing(db: None) -> None:
    response = overloaded(RequestFactory().post("/api/v1/jobs"), retry_after_s=1)
    assert json.loads(response.content)["code"] == "overloaded" and cache.get(BLIND_SINCE_KEY) is None


def _run(nodes: list[Node], *, shed: bool, monkeypatch: pytest.MonkeyPatch) -> str:
    """The node's heartbeats stop reaching the database at t0; for NODE_DOWN_S + 100 s its agent's
    heartbeats are shed (every 5 s, as an agent retries) or are not heard at all; the checker runs every
    10 s throughout. The node's state at the end."""
    t0 = timezone.now()
    Node.objects.update(last_heartbeat=t0)
    clock = SimpleNamespace(time=lambda: t0.timestamp())
    monkeypatch.setattr(middleware, "time", clock)  # the web tier's clock, stepped with the checker's
    nodes_check(now=t0)
    end = t0 + timedelta(seconds=settings.YARD["NODE_DOWN_S"] + 100)
    now: datetime = t0
    while now < end:
        for _ in range(2):
            now += timedelta(seconds=5)
            clock.time = lambda at=now: at.timestamp()
            if shed:
                _shed_heartbeat()
        nodes_check(now=now)
    return Node.objects.get(pk=nodes[0].pk).state


def test_a_node_whose_heartbeats_are_shed_is_never_marked_down(nodes: list[Node], monkeypatch: pytest.MonkeyPatch) -> None:
    assert _run(nodes, shed=True, monkeypatch=monkeypatch) == NodeState.READY


def test_a_node_that_is_not_heard_at_all_is_marked_down_as_before(nodes: list[Node], monkeypatch: pytest.MonkeyPatch) -> None:
    # Both nodes silent: the disruption guard's minimum (3 nodes) is not met, so they are judged.
    assert _run(nodes, shed=False, monkeypatch=monkeypatch) == NodeState.DOWN
