"""POST heartbeat: each task's real CPU and memory use, as its agent measured it, stored on the task."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from nodeagent import protocol as agent_protocol
from scheduling.agent import protocol
from scheduling.models import Node, Task
from tests.agent_api.conftest import AgentClient, heartbeat_body, task_report

Gang = Callable[..., list[Task]]


def use_of(task: Task) -> tuple[float | None, float | None, float | None]:
    row = Task.objects.get(pk=task.pk)
    return row.cpu_used, row.memory_used_mb, row.memory_peak_mb


def test_a_heartbeat_carrying_use_stores_it_on_the_task(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0])])[0]
    report = task_report(task, cpu_used=3.2, memory_used_mb=12390.4, memory_peak_mb=14336.0)
    assert agent.post("heartbeat", heartbeat_body(tasks=[report])).status_code == 200
    assert use_of(task) == (3.2, 12390.4, 14336.0)


def test_a_later_reading_replaces_the_earlier_one(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0])])[0]
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, cpu_used=3.2, memory_used_mb=1000.0, memory_peak_mb=1000.0)]))
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, cpu_used=0.5, memory_used_mb=2000.0, memory_peak_mb=2000.0)]))
    assert use_of(task) == (0.5, 2000.0, 2000.0)


def test_absent_or_null_fields_leave_the_stored_use_unchanged(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0])])[0]
    Task.objects.filter(pk=task.pk).update(cpu_used=1.5, memory_used_mb=800.0, memory_peak_mb=900.0)
    assert agent.post("heartbeat", heartbeat_body(tasks=[task_report(task)])).status_code == 200
    assert agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, cpu_used=None)])).status_code == 200
    assert use_of(task) == (1.5, 800.0, 900.0)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cpu_used": -0.1}, "tasks[0].cpu_used"),
        ({"cpu_used": 1e9}, "tasks[0].cpu_used"),
        ({"cpu_used": "lots"}, "tasks[0].cpu_used"),
        ({"memory_used_mb": -1}, "tasks[0].memory_used_mb"),
        ({"memory_peak_mb": 1e308}, "tasks[0].memory_peak_mb"),
    ],
)
def test_out_of_range_use_is_refused_naming_the_field(
    agent: AgentClient, gang: Gang, nodes: list[Node], fields: dict[str, object], field: str
) -> None:
    task = gang([(nodes[0], [0])])[0]
    answer = agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, **fields)]))
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert body["code"] == "invalid" and field in body["errors"], body
    assert use_of(task) == (None, None, None)


def test_use_of_many_tasks_is_one_write(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    tasks = [gang([(nodes[0], [i])])[0] for i in range(4)]

    def beat(cpu: float) -> int:
        reports = [task_report(t, cpu_used=cpu, memory_used_mb=100.0 * cpu) for t in tasks]
        with CaptureQueriesContext(connection) as queries:
            assert agent.post("heartbeat", heartbeat_body(tasks=reports)).status_code == 200
        return sum(1 for q in queries.captured_queries if 'UPDATE "scheduling_task"' in q["sql"])

    beat(1.0)
    assert beat(2.0) == 1
    assert beat(2.001) == 0  # jitter below 1 % is not worth a write
    assert [use_of(t)[0] for t in tasks] == [2.0] * 4


def test_the_agent_knows_the_bounds_the_portal_enforces() -> None:
    for name, (low, high) in agent_protocol.TASK_USE_BOUNDS.items():
        spec = protocol.TASK_REPORT.props[name].spec
        assert isinstance(spec, protocol.Float) and (spec.minimum, spec.maximum) == (low, high), name
