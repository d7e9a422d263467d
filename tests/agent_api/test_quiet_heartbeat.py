"""The quiet heartbeat (services.heartbeat.node_heartbeat_by_token): a beat that changes nothing is two
statements and no transaction; one that changes anything is decided and written in the transaction, as
before. ``_quiet`` must say "nothing to write" exactly when ``_heartbeat`` writes nothing: held here
change by change."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.agent import protocol
from scheduling.agent.services import heartbeat_from
from scheduling.agent.services.heartbeat import _heartbeat, _quiet
from scheduling.agent.services.live_tasks import live_tasks_of
from scheduling.models import Node, NodeState, Task
from scheduling.states import TaskState
from tests.agent_api.conftest import AgentClient, heartbeat_body, task_report

Gang = Callable[..., list[Task]]
STARTED = 1796012000.0


def running(agent: AgentClient, gang: Gang, nodes: list[Node], count: int = 2) -> list[Task]:
    """``count`` one-GPU tasks RUNNING on the first node, started by their agent's report."""
    tasks = [gang([(nodes[0], [i])])[0] for i in range(count)]
    assert agent.post("heartbeat", heartbeat_body(tasks=[task_report(t, started_at=STARTED) for t in tasks])).status_code == 200
    return tasks


def reports(tasks: list[Task], **fields: Any) -> list[dict[str, Any]]:
    return [task_report(t, started_at=STARTED, **fields) for t in tasks]


def _steady(node: Node, tasks: list[Task]) -> dict[str, Any]:
    return heartbeat_body(tasks=reports(tasks))


def _down_with_stale_work(node: Node, tasks: list[Task]) -> dict[str, Any]:
    Node.objects.filter(pk=node.pk).update(state=NodeState.DOWN)
    Task.objects.filter(pk=tasks[0].pk).update(state=TaskState.LOST)
    return heartbeat_body(tasks=reports(tasks))  # the lost task is still running there: the node stays DOWN


def _use_jitter(node: Node, tasks: list[Task]) -> dict[str, Any]:
    Task.objects.filter(pk__in=[t.pk for t in tasks]).update(cpu_used=3.0)
    return heartbeat_body(tasks=reports(tasks, cpu_used=3.01))  # within 1 %: not worth a write


def _not_ready(node: Node, tasks: list[Task]) -> dict[str, Any]:
    Node.objects.filter(pk=node.pk).update(state=NodeState.NOT_READY)
    return heartbeat_body(tasks=reports(tasks))


def _held(node: Node, tasks: list[Task]) -> dict[str, Any]:
    Node.objects.filter(pk=node.pk).update(hold_reason="an admin looks at it")
    return heartbeat_body(tasks=reports(tasks))


def _draining_reason(node: Node, tasks: list[Task]) -> dict[str, Any]:
    return heartbeat_body(tasks=reports(tasks), draining_reason="could not kill task 7")


def _disk_full(node: Node, tasks: list[Task]) -> dict[str, Any]:
    return heartbeat_body(tasks=reports(tasks), disk_problem="/var/lib/yard: 99% full")


def _runtime(node: Node, tasks: list[Task]) -> dict[str, Any]:
    return heartbeat_body(tasks=reports(tasks), container_runtime="podman")


def _clock_skew(node: Node, tasks: list[Task]) -> dict[str, Any]:
    return heartbeat_body(tasks=reports(tasks), clock_offset_s=30.0)


def _checkpoint(node: Node, tasks: list[Task]) -> dict[str, Any]:
    return heartbeat_body(tasks=reports(tasks, checkpoint_time=STARTED + 600))


def _first_use(node: Node, tasks: list[Task]) -> dict[str, Any]:
    return heartbeat_body(tasks=reports(tasks, cpu_used=3.0))


def _notebook(node: Node, tasks: list[Task]) -> dict[str, Any]:
    notebook = {"url": None, "kernel_busy": True, "last_activity": STARTED + 60}
    return heartbeat_body(tasks=reports(tasks, notebook=notebook))


def _a_start(node: Node, tasks: list[Task]) -> dict[str, Any]:
    Task.objects.filter(pk=tasks[0].pk).update(state=TaskState.ASSIGNED, started_at=None)
    return heartbeat_body(tasks=reports(tasks))


def _never_started(node: Node, tasks: list[Task]) -> dict[str, Any]:
    Task.objects.filter(pk=tasks[0].pk).update(state=TaskState.STOPPING, started_at=None)
    return heartbeat_body(tasks=reports(tasks[1:]))


def _readings(node: Node, tasks: list[Task]) -> dict[str, Any]:
    gpu = {"index": 0, "utilization_pct": 50.0, "memory_used_mb": 1.0, "temperature_c": 40.0, "power_w": 100.0}
    return heartbeat_body(tasks=reports(tasks), gpus=[gpu])


QUIET = [_steady, _down_with_stale_work, _use_jitter]
CHANGES = [_not_ready, _held, _draining_reason, _disk_full, _runtime, _clock_skew, _checkpoint, _first_use, _notebook, _a_start]
CHANGES += [_never_started, _readings]


def decide(node: Node, body: dict[str, Any]) -> tuple[bool, list[str]]:
    """What _quiet says of ``body``, and the statements _heartbeat writes for it (rolled back)."""
    beat = heartbeat_from(protocol.validate(protocol.HEARTBEAT, body), received=time.time())
    fresh = Node.objects.get(pk=node.pk)
    quiet = _quiet(node=fresh, live=live_tasks_of(node=fresh), heartbeat=beat)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            _heartbeat(node=Node.objects.get(pk=node.pk), heartbeat=beat, now=timezone.now())
        transaction.set_rollback(True)
    reads = ("SELECT", "SAVEPOINT", "RELEASE")
    return quiet, [q["sql"][:80] for q in queries.captured_queries if not q["sql"].lstrip().upper().startswith(reads)]


@pytest.mark.parametrize("scenario", QUIET + CHANGES, ids=lambda f: f.__name__.strip("_"))
def test_quiet_says_nothing_to_write_exactly_when_the_heartbeat_writes_nothing(
    scenario: Callable[[Node, list[Task]], dict[str, Any]], agent: AgentClient, gang: Gang, nodes: list[Node]
) -> None:
    tasks = running(agent, gang, nodes)
    quiet, writes = decide(nodes[0], scenario(nodes[0], tasks))
    assert quiet == (not writes), writes
    assert quiet == (scenario in QUIET)


def test_a_quiet_beat_is_two_statements_and_a_change_is_written_in_the_transaction(
    agent: AgentClient, gang: Gang, nodes: list[Node]
) -> None:
    tasks = running(agent, gang, nodes)
    with CaptureQueriesContext(connection) as queries:
        answer = agent.post("heartbeat", heartbeat_body(tasks=reports(tasks)))
    assert answer.status_code == 200 and [s["started"] for s in answer.json()["desired"]] == [True, True]
    statements = [q["sql"].split()[0] for q in queries.captured_queries]
    assert statements == ["UPDATE", "SELECT"]  # the liveness (by token) and the live tasks; no savepoint, no write

    with CaptureQueriesContext(connection) as queries:
        answer = agent.post("heartbeat", heartbeat_body(tasks=reports(tasks, checkpoint_time=STARTED + 600)))
    assert answer.status_code == 200
    assert Task.objects.get(pk=tasks[0].pk).checkpoint_at is not None
    # Read without the transaction, found a change, then read again and written inside it (a savepoint in a test).
    assert [q["sql"].split()[0] for q in queries.captured_queries][:3] == ["UPDATE", "SELECT", "SAVEPOINT"]
