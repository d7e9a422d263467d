"""POST drain: the agent takes its node out of placement."""

from __future__ import annotations

from scheduling.models import Node, NodeState
from tests.agent_api.conftest import AgentClient


def test_drain_sets_the_node_draining_with_the_reason(agent: AgentClient, nodes: list[Node]) -> None:
    response = agent.post("drain", {"reason": "task 4411 survived SIGKILL for 60 s"})
    assert (response.status_code, response.json()) == (200, {"node_state": NodeState.DRAINING})
    node = Node.objects.get(pk=nodes[0].pk)
    assert (node.state, node.state_reason) == (NodeState.DRAINING, "task 4411 survived SIGKILL for 60 s")


def test_drain_leaves_other_nodes_alone(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("drain", {"reason": "stuck"})
    assert Node.objects.get(pk=nodes[1].pk).state == NodeState.READY


def test_drain_needs_a_reason(agent: AgentClient) -> None:
    assert agent.post("drain", {}).status_code == 400
