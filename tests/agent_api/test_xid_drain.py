"""Critical XID errors and an agent's own drain hold the node DRAINING until an admin resumes it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from django.utils import timezone

from scheduling.models import Gpu, Node, NodeState, Task, XidEvent
from scheduling.selectors import snapshot_build
from scheduling.services import node_mark_lost, node_resume
from tenants.models import AuditEntry
from tests.agent_api.conftest import AgentClient, heartbeat_body, task_report
from tests.agent_api.test_heartbeat import sample

Gang = Callable[..., list[Task]]


def _node(nodes: list[Node]) -> Node:
    return Node.objects.get(pk=nodes[0].pk)


def test_a_critical_xid_drains_the_node_and_takes_the_gpu_out(agent: AgentClient, nodes: list[Node]) -> None:
    body = agent.post("heartbeat", heartbeat_body(gpus=[sample(3, xid_errors=[79])])).json()
    node = _node(nodes)
    assert body["node_state"] == node.state == NodeState.DRAINING
    assert "XID 79 (GPU has fallen off the bus) on GPU 3" in node.state_reason
    assert node.hold_reason == node.state_reason
    assert not Gpu.objects.get(node=node, index=3).healthy
    assert Gpu.objects.filter(node=node, healthy=True).count() == 7
    topology = {n.name: n for n in snapshot_build(now=timezone.now()).topology.nodes}
    assert not topology[node.name].schedulable and 3 not in {g.index for g in topology[node.name].gpus}
    audited = AuditEntry.objects.filter(action="node.xid_drain", object_id=str(node.pk), actor_label=f"agent {node.name}")
    assert audited.count() == 1


def test_an_application_xid_is_recorded_and_drains_nothing(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[sample(0, xid_errors=[13, 43])]))
    node = _node(nodes)
    assert (node.state, node.hold_reason) == (NodeState.READY, "")
    assert Gpu.objects.get(node=node, index=0).healthy
    assert XidEvent.objects.filter(gpu__node=node).count() == 2


def test_the_drain_codes_are_a_setting(agent: AgentClient, nodes: list[Node], settings) -> None:
    settings.YARD = {**settings.YARD, "XID_DRAIN_CODES": frozenset({13})}
    agent.post("heartbeat", heartbeat_body(gpus=[sample(0, xid_errors=[79]), sample(1, xid_errors=[13])]))
    node = _node(nodes)
    assert node.state == NodeState.DRAINING and "XID 13" in node.state_reason and "XID 79" not in node.state_reason


def test_running_work_keeps_running_on_a_node_drained_by_an_xid(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    body = agent.post("heartbeat", heartbeat_body(gpus=[sample(5, xid_errors=[48])], tasks=[task_report(task)])).json()
    assert body["node_state"] == NodeState.DRAINING
    assert [(d["task_id"], d["action"]) for d in body["desired"]] == [(task.pk, "run")]


def test_repeated_xids_are_audited_once(agent: AgentClient, nodes: list[Node]) -> None:
    for _ in range(3):
        agent.post("heartbeat", heartbeat_body(gpus=[sample(2, xid_errors=[95])]))
    assert AuditEntry.objects.filter(action="node.xid_drain").count() == 1
    assert XidEvent.objects.filter(gpu__node=nodes[0], code=95).count() == 3


def test_a_held_node_back_from_down_returns_draining_not_ready(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[sample(1, xid_errors=[74])]))
    node_mark_lost(node=nodes[0], reason="test")
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.DOWN, state_reason="no heartbeat")
    body = agent.post("heartbeat", heartbeat_body()).json()
    node = _node(nodes)
    assert body["node_state"] == node.state == NodeState.DRAINING
    assert node.state_reason.startswith("held until an admin resumes it: XID 74")


def test_resume_returns_the_node_and_its_gpus_to_placement(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[sample(3, xid_errors=[79])]))
    node = node_resume(node=_node(nodes), actor=None, actor_label="cat")
    assert (node.state, node.hold_reason, node.state_reason) == (NodeState.READY, "", "resumed by cat")
    assert Gpu.objects.filter(node=node, healthy=False).count() == 0
    assert agent.post("heartbeat", heartbeat_body()).json()["node_state"] == NodeState.READY
    assert "1 GPU(s) healthy again" in AuditEntry.objects.get(action="node.resume").message


def test_a_node_resumed_while_silent_waits_for_its_agent(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[sample(3, xid_errors=[79])]))
    Node.objects.filter(pk=nodes[0].pk).update(last_heartbeat=timezone.now() - timedelta(minutes=3))
    assert node_resume(node=_node(nodes), actor=None, actor_label="cat").state == NodeState.NOT_READY
    assert agent.post("heartbeat", heartbeat_body()).json()["node_state"] == NodeState.READY


def test_an_agent_drain_holds_until_resumed(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(draining_reason="task 7 survived SIGKILL for 60 s"))
    assert _node(nodes).hold_reason == "task 7 survived SIGKILL for 60 s"
    # The agent restarts and no longer reports it: the node stays out until a person resumes it.
    assert agent.post("heartbeat", heartbeat_body()).json()["node_state"] == NodeState.DRAINING
    node_resume(node=_node(nodes), actor=None, actor_label="cat")
    assert agent.post("heartbeat", heartbeat_body()).json()["node_state"] == NodeState.READY


def test_resume_while_the_agent_still_reports_a_stuck_task_drains_again(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("drain", {"reason": "task 7 survived SIGKILL for 60 s"})
    assert _node(nodes).hold_reason == "task 7 survived SIGKILL for 60 s"
    node_resume(node=_node(nodes), actor=None, actor_label="cat")
    body = agent.post("heartbeat", heartbeat_body(draining_reason="task 7 survived SIGKILL for 60 s")).json()
    assert body["node_state"] == NodeState.DRAINING
    assert _node(nodes).hold_reason == "task 7 survived SIGKILL for 60 s"
