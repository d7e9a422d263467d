"""Enrolment tokens: a use count (one node by default), an expiry, and optional approval before a node gets work."""

from __future__ import annotations

import threading
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
import requests
from django.conf import settings
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from scheduling.agent.enrolment import enrolment_token_create
from scheduling.models import EnrolmentToken, Node, NodeState
from scheduling.selectors import snapshot_build
from scheduling.services import node_resume
from tenants.models import AuditEntry
from tests.agent_api.conftest import AgentClient
from tests.factories import make_user

from .test_register import registration

pytestmark = pytest.mark.django_db


def _token(**kw: Any) -> str:
    return enrolment_token_create(actor=None, name="rack-1", **kw)[1]


def test_a_new_token_registers_one_node_and_not_a_second(db: None) -> None:
    client = AgentClient(_token())
    assert client.post("register", registration("gpu-01")).status_code == 201
    rogue = client.post("register", registration("rogue-02"))
    assert rogue.status_code == 401
    assert "registered all the nodes it may" in rogue.json()["message"]
    assert list(Node.objects.values_list("name", flat=True)) == ["gpu-01"]
    assert not Node.objects.filter(leaf__name="rogue-leaf").exists()
    assert EnrolmentToken.objects.get().uses == 1


def test_a_token_for_n_nodes_registers_n(db: None) -> None:
    client = AgentClient(_token(max_uses=3))
    codes = [client.post("register", registration(f"gpu-{i:02}")).status_code for i in range(4)]
    assert codes == [201, 201, 201, 401]
    assert EnrolmentToken.objects.get().uses == 3


def test_a_failed_registration_gives_its_use_back(db: None) -> None:
    client = AgentClient(_token())
    assert client.post("register", registration("gpu-01")).status_code == 201
    EnrolmentToken.objects.update(max_uses=2)
    assert client.post("register", registration("gpu-01")).status_code == 409  # the name is taken: rolled back whole
    assert EnrolmentToken.objects.get().uses == 1
    assert client.post("register", registration("gpu-02")).status_code == 201


def test_an_expired_token_registers_nothing(db: None) -> None:
    raw = _token(expires_in=timedelta(minutes=5))
    EnrolmentToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert AgentClient(raw).post("register", registration("gpu-01")).status_code == 401
    assert not Node.objects.exists()


def test_tokens_expire_in_a_day_by_default(db: None) -> None:
    token, _ = enrolment_token_create(actor=None, name="rack-1")
    assert timedelta(hours=23) < token.expires_at - timezone.now() <= timedelta(hours=24)


def test_two_agents_racing_for_the_last_use_get_one_node(live_server: Any) -> None:
    raw = _token()
    barrier = threading.Barrier(2)
    codes: list[int] = []

    def register(name: str) -> None:
        barrier.wait()
        answer = requests.post(
            f"{live_server.url}/api/agent/v1/register",
            json=registration(name),
            headers={"Authorization": f"Bearer {raw}"},
            timeout=30,
        )
        codes.append(answer.status_code)

    threads = [threading.Thread(target=register, args=(f"gpu-{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(codes) == [201, 401]
    assert Node.objects.count() == 1 and EnrolmentToken.objects.get().uses == 1


def test_the_configured_token_counts_its_uses_too(db: None) -> None:
    raw = "yen_from-the-environment-0123456789"
    yard = {**settings.YARD, "AGENT_ENROLMENT_TOKEN": raw, "AGENT_ENROLMENT_MAX_USES": 2}
    with override_settings(YARD=yard):
        client = AgentClient(raw)
        codes = [client.post("register", registration(f"gpu-{i}")).status_code for i in range(3)]
    assert codes == [201, 201, 401]
    with override_settings(YARD={**yard, "AGENT_ENROLMENT_MAX_USES": 3}):  # an operator raises it for one more
        assert AgentClient(raw).post("register", registration("gpu-9")).status_code == 201


def test_registration_is_audited(db: None) -> None:
    AgentClient(_token()).post("register", registration("gpu-01"))
    entry = AuditEntry.objects.get(action="node.register")
    assert entry.actor_label == "agent gpu-01" and "rack-1" in entry.message and "1 of 1" in entry.message


def _heartbeat(token: str) -> Any:
    return AgentClient(token).post("heartbeat", {"gpus": [], "tasks": []})


def test_a_node_that_needs_approval_takes_no_work_until_an_admin_approves_it(db: None) -> None:
    answer = AgentClient(_token(requires_approval=True)).post("register", registration("gpu-01"))
    node_token = answer.json()["token"]
    beat = _heartbeat(node_token)
    assert beat.status_code == 200 and beat.json()["node_state"] == NodeState.DRAINING
    node = Node.objects.get(name="gpu-01")
    assert "approval" in node.state_reason
    assert [n.schedulable for n in snapshot_build(now=timezone.now()).topology.nodes] == [False]
    node_resume(node=node, actor=make_user("root"))
    assert _heartbeat(node_token).json()["node_state"] == NodeState.READY
    assert [n.schedulable for n in snapshot_build(now=timezone.now()).topology.nodes] == [True]
    assert AuditEntry.objects.filter(action="node.resume", object_id=str(node.pk)).exists()


def test_the_deployment_can_require_approval_for_every_new_node(db: None) -> None:
    with override_settings(YARD={**settings.YARD, "AGENT_REQUIRE_APPROVAL": True}):
        token = AgentClient(_token()).post("register", registration("gpu-01")).json()["token"]
        assert _heartbeat(token).json()["node_state"] == NodeState.DRAINING


def test_without_approval_a_node_is_ready_at_its_first_heartbeat(db: None) -> None:
    token = AgentClient(_token()).post("register", registration("gpu-01")).json()["token"]
    assert _heartbeat(token).json()["node_state"] == NodeState.READY


def test_the_command_prints_a_token_that_registers(db: None) -> None:
    out, err = StringIO(), StringIO()
    call_command("enrolment_token", "rack-7", "--nodes", "2", "--expires-in", "2h", "--approval", stdout=out, stderr=err)
    raw = out.getvalue().strip()
    assert raw.startswith("yen_") and "up to 2 node(s)" in err.getvalue()
    token = EnrolmentToken.objects.get(name="rack-7")
    assert (token.max_uses, token.requires_approval) == (2, True) and token.token_hash != raw
    assert AgentClient(raw).post("register", registration("gpu-01")).status_code == 201


def test_a_drain_the_agent_asks_for_is_audited_once(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("drain", {"reason": "task 4411 survived SIGKILL for 60 s"})
    agent.post("drain", {"reason": "task 4411 survived SIGKILL for 60 s"})  # a repeat changes nothing
    entry = AuditEntry.objects.get(action="node.drain")
    assert entry.actor_label == f"agent {nodes[0].name}" and "4411" in entry.message
    assert entry.data == {"from": NodeState.READY, "state": NodeState.DRAINING}
