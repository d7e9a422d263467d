"""POST tasks/{id}/logs: chunks stored at their UTF-8 byte offsets, each byte once."""

from __future__ import annotations

from collections.abc import Callable

from scheduling.models import Node, Task, TaskLogChunk
from scheduling.services import node_mark_lost
from tests.agent_api.conftest import AgentClient

Gang = Callable[..., list[Task]]


def stored(task: Task) -> str:
    return "".join(TaskLogChunk.objects.filter(task=task).order_by("offset").values_list("data", flat=True))


def ship(agent: AgentClient, task: Task, offset: int, data: str, attempt: int | None = None) -> dict[str, object]:
    response = agent.post(f"tasks/{task.pk}/logs", {"attempt": attempt or task.attempt, "offset": offset, "data": data})
    return {"status": response.status_code, **response.json()}


def test_chunks_append_and_answer_the_next_offset(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    assert ship(agent, task, 0, "step 1 loss 2.0\n") == {"status": 200, "next_offset": 16}
    assert ship(agent, task, 16, "step 2 loss 1.9\n") == {"status": 200, "next_offset": 32}
    assert stored(task) == "step 1 loss 2.0\nstep 2 loss 1.9\n"


def test_a_chunk_delivered_twice_is_stored_once(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    ship(agent, task, 0, "hello\n")
    assert ship(agent, task, 0, "hello\n") == {"status": 200, "next_offset": 6}
    assert TaskLogChunk.objects.filter(task=task).count() == 1


def test_an_overlapping_chunk_adds_only_its_new_part(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    ship(agent, task, 0, "abc")
    ship(agent, task, 0, "abcdef")
    assert stored(task) == "abcdef"


def test_offsets_count_utf8_bytes(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    assert ship(agent, task, 0, "λ→\n")["next_offset"] == 6
    ship(agent, task, 6, "ok")
    assert stored(task) == "λ→\nok"


def test_nul_characters_are_stored_without_moving_offsets(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    assert ship(agent, task, 0, "a\x00b")["next_offset"] == 3
    assert stored(task) == "a\ufffdb"


def test_logs_of_another_attempt_are_stale(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    assert ship(agent, task, 0, "x", attempt=task.attempt + 1) == {"status": 409, "code": "stale_attempt"}


def test_logs_of_a_lost_task_are_stale(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang()[0]
    node_mark_lost(node=nodes[0], reason="test")
    assert ship(agent, task, 0, "x")["status"] == 409


def test_logs_of_another_nodes_task_are_not_found(other_agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    assert ship(other_agent, task, 0, "x") == {"status": 404, "code": "not_found"}
