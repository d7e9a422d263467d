"""An agent's disk and clock: a full disk drains its node until there is room again (no admin needed,
unlike an XID), and the times it reports are shifted into the portal's clock by the offset it measured."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from django.utils import timezone

from scheduling.models import GpuWindow, Node, NodeState, Task
from scheduling.selectors import snapshot_build
from scheduling.services import node_hold, node_resume
from tests.agent_api.conftest import AgentClient, heartbeat_body, task_report
from tests.agent_api.test_heartbeat import window

Gang = Callable[..., list[Task]]
FULL = "/var/lib/yard-agent has 12.0 KiB free of 2.0 MiB"


def _node(nodes: list[Node]) -> Node:
    return Node.objects.get(pk=nodes[0].pk)


def test_a_full_disk_drains_the_node_and_room_again_returns_it(agent: AgentClient, nodes: list[Node]) -> None:
    body = agent.post("heartbeat", heartbeat_body(disk_problem=FULL)).json()
    node = _node(nodes)
    assert body["node_state"] == node.state == NodeState.DRAINING
    assert node.state_reason == f"disk full: {FULL}" and node.disk_problem == FULL and node.hold_reason == ""
    topology = {n.name: n for n in snapshot_build(now=timezone.now()).topology.nodes}
    assert not topology[node.name].schedulable
    body = agent.post("heartbeat", heartbeat_body(disk_problem=None)).json()
    node = _node(nodes)
    assert body["node_state"] == node.state == NodeState.READY
    assert (node.state_reason, node.disk_problem) == ("its disk has room again", "")


def test_room_again_does_not_undo_an_admins_drain(agent: AgentClient, nodes: list[Node], user) -> None:
    agent.post("heartbeat", heartbeat_body(disk_problem=FULL))
    node_hold(node=_node(nodes), reason="replace GPU 3", actor=user)
    agent.post("heartbeat", heartbeat_body(disk_problem=None))
    node = _node(nodes)
    assert node.state == NodeState.DRAINING and node.hold_reason.startswith("replace GPU 3")
    node_resume(node=node, actor=user)
    assert _node(nodes).state == NodeState.READY


def test_running_work_keeps_running_on_a_node_with_a_full_disk(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    body = agent.post("heartbeat", heartbeat_body(disk_problem=FULL, tasks=[task_report(task)])).json()
    assert [(d["task_id"], d["action"]) for d in body["desired"]] == [(task.pk, "run")]


def test_the_agents_times_are_shifted_by_its_measured_offset(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    """An agent 300 s ahead: its clock_offset_s is -300; its times land 300 s earlier, windows by whole windows."""
    task = gang([(nodes[0], [0, 1])])[0]
    now = timezone.now().timestamp()
    ahead = now + 300
    minute = (ahead // 60) * 60 - 60
    body = heartbeat_body(
        tasks=[task_report(task, started_at=ahead - 5, checkpoint_time=ahead - 2)],
        windows=[window(0, minute, 6, 120.0, 80.0)],
        agent_time=ahead,
        clock_offset_s=-299.8,
        clock_offset_error_s=0.01,
    )
    answer = agent.post("heartbeat", body).json()
    assert abs(answer["portal_time"] - timezone.now().timestamp()) < 5
    task.refresh_from_db()
    assert abs(task.started_at.timestamp() - (now - 5)) < 1
    assert abs(task.checkpoint_at.timestamp() - (now - 2)) < 1
    (stored,) = GpuWindow.objects.filter(gpu__node=nodes[0])
    assert stored.start == datetime.fromtimestamp(minute - 300, tz=UTC)  # five whole windows earlier
    assert _node(nodes).clock_skew_s == 299.8
    # The exit report, on its own endpoint, is shifted by the offset it carries.
    agent.post(
        f"tasks/{task.pk}/status", {"attempt": 1, "state": "exited", "exit_code": 0, "ended_at": ahead, "clock_offset_s": -300.0}
    )
    task.refresh_from_db()
    assert abs(task.ended_at.timestamp() - now) < 1


def test_before_its_first_estimate_the_offset_comes_from_agent_time(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    now = timezone.now().timestamp()
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, started_at=now - 605)], agent_time=now - 600))
    task.refresh_from_db()
    assert abs(task.started_at.timestamp() - (now - 5)) < 2
    assert abs(_node(nodes).clock_skew_s + 600) < 2


def test_a_clock_within_a_second_is_left_alone(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    started = timezone.now().timestamp() - 30
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, started_at=started)], clock_offset_s=0.4))
    task.refresh_from_db()
    assert task.started_at == datetime.fromtimestamp(started, tz=UTC)
    assert _node(nodes).clock_skew_s == -0.4


def test_nonsense_offsets_are_refused(agent: AgentClient, nodes: list[Node]) -> None:
    for bad in ("soon", float("inf"), 1e12):
        response = agent.post("heartbeat", {**heartbeat_body(), "clock_offset_s": bad})
        assert response.status_code == 400, bad
        assert "clock_offset_s" in str(response.json()), response.json()
