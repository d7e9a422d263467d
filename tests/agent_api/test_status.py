"""POST tasks/{id}/status: starts and ends go through the scheduling services; stale reports are refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduling.models import Allocation, Job, Node, Task
from scheduling.services import node_mark_lost
from scheduling.states import JobState, TaskState
from tests.agent_api.conftest import AgentClient

Gang = Callable[..., list[Task]]


def running(task: Task, **fields: Any) -> dict[str, Any]:
    return {"attempt": task.attempt, "state": "running", "pid": 81234, "started_at": 1796010000.0, **fields}


def exited(task: Task, **fields: Any) -> dict[str, Any]:
    body = {
        "attempt": task.attempt,
        "state": "exited",
        "pid": 81234,
        "exit_code": 0,
        "signal": None,
        "stopped_by": None,
        "stop_cause": None,
        "started_at": 1796010000.0,
        "ended_at": 1796012400.5,
        "notebook_url": None,
    }
    body.update(fields)
    return body


def test_running_report_marks_the_task_running(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    response = agent.post(f"tasks/{task.pk}/status", running(task))
    assert (response.status_code, response.json()) == (200, {})
    task.refresh_from_db()
    assert (task.state, task.pid) == (TaskState.RUNNING, 81234)


def test_the_job_runs_when_every_rank_runs(agent: AgentClient, other_agent: AgentClient, gang: Gang) -> None:
    first, second = gang()
    agent.post(f"tasks/{first.pk}/status", running(first))
    assert Job.objects.get(pk=first.job_id).state == JobState.STARTING
    other_agent.post(f"tasks/{second.pk}/status", running(second))
    assert Job.objects.get(pk=first.job_id).state == JobState.RUNNING


def test_a_repeated_running_report_is_accepted(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    agent.post(f"tasks/{task.pk}/status", running(task))
    assert agent.post(f"tasks/{task.pk}/status", running(task)).status_code == 200


def test_exits_of_every_rank_complete_the_job_and_free_its_gpus(agent: AgentClient, other_agent: AgentClient, gang: Gang) -> None:
    first, second = gang()
    agent.post(f"tasks/{first.pk}/status", exited(first))
    other_agent.post(f"tasks/{second.pk}/status", exited(second))
    assert Job.objects.get(pk=first.job_id).state == JobState.COMPLETED
    assert not Allocation.objects.filter(job_id=first.job_id, released_at__isnull=True).exists()


def test_an_exit_without_a_running_report_is_accepted(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    assert agent.post(f"tasks/{task.pk}/status", exited(task, exit_code=None, signal=9, stopped_by="sigkill")).status_code == 200
    task.refresh_from_db()
    assert (task.state, task.signal, task.stopped_by) == (TaskState.EXITED, 9, "sigkill")


def test_a_repeated_exit_report_is_accepted(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    agent.post(f"tasks/{task.pk}/status", exited(task))
    assert agent.post(f"tasks/{task.pk}/status", exited(task)).status_code == 200


def test_a_report_for_another_attempt_is_stale(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    response = agent.post(f"tasks/{task.pk}/status", running(task, attempt=task.attempt + 1))
    assert (response.status_code, response.json()) == (409, {"code": "stale_attempt"})


def test_a_report_for_a_lost_task_is_stale(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang()[0]
    node_mark_lost(node=nodes[0], reason="test")
    assert agent.post(f"tasks/{task.pk}/status", exited(task)).status_code == 409
    assert agent.post(f"tasks/{task.pk}/status", running(task)).status_code == 409


def test_a_running_report_for_an_ended_task_is_stale(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    agent.post(f"tasks/{task.pk}/status", exited(task))
    assert agent.post(f"tasks/{task.pk}/status", running(task)).status_code == 409


def test_another_nodes_task_is_not_found(other_agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]  # rank 0 runs on the first node
    response = other_agent.post(f"tasks/{task.pk}/status", running(task))
    assert (response.status_code, response.json()) == (404, {"code": "not_found"})
    assert Task.objects.get(pk=task.pk).state == TaskState.ASSIGNED


def test_an_unknown_state_is_invalid(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    response = agent.post(f"tasks/{task.pk}/status", running(task, state="sleeping"))
    assert response.status_code == 400
    assert "state" in response.json()["errors"]


def _stopped_by_agent(agent: AgentClient, other_agent: AgentClient, gang: Gang, cause: str) -> Job:
    first, second = gang()
    for client, task in ((agent, first), (other_agent, second)):
        client.post(f"tasks/{task.pk}/status", running(task))
    for client, task in ((agent, first), (other_agent, second)):
        body = exited(task, exit_code=None, signal=15, stopped_by="sigterm", stop_cause=cause)
        assert client.post(f"tasks/{task.pk}/status", body).status_code == 200
    return Job.objects.get(pk=first.job_id)


def test_a_gang_its_agents_stopped_past_the_time_limit_fails_with_that_reason(
    agent: AgentClient, other_agent: AgentClient, gang: Gang
) -> None:
    job = _stopped_by_agent(agent, other_agent, gang, "time_limit")
    assert (job.state, job.stop_reason) == (JobState.FAILED, "TIME_LIMIT")
    assert job.events.filter(reason__contains="past its time limit").exists()


def test_a_gang_stopped_because_its_agent_lost_the_portal_is_requeued_not_failed(
    agent: AgentClient, other_agent: AgentClient, gang: Gang
) -> None:
    job = _stopped_by_agent(agent, other_agent, gang, "portal_unreachable")
    assert (job.state, job.attempt) == (JobState.PENDING, 2)
    assert job.events.filter(reason__contains="lost the portal").exists()
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_an_unknown_stop_cause_is_invalid(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    response = agent.post(f"tasks/{task.pk}/status", exited(task, stop_cause="gremlins"))
    assert response.status_code == 400
