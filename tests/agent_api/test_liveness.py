"""Node liveness: NOT_READY, then DOWN with its gangs requeued exactly once; the timings fit together."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from scheduling.agent.liveness import nodes_check
from scheduling.agent.tasks import check_nodes
from scheduling.models import Allocation, Job, JobEvent, Node, NodeState, Task
from scheduling.states import JobState, TaskState
from tests.agent_api.conftest import AgentClient, heartbeat_body, task_report

Gang = Callable[..., list[Task]]


def silent_for(node: Node, seconds: float) -> None:
    Node.objects.filter(pk=node.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=seconds))


def state_of(node: Node) -> str:
    return Node.objects.get(pk=node.pk).state


def test_the_timings_fit_together() -> None:
    yard = settings.YARD
    # Stale work on a partitioned node is gone before the portal requeues it elsewhere.
    assert yard["AGENT_STOP_AFTER_S"] + yard["GRACE_PERIOD_S"] < yard["NODE_DOWN_S"]
    # One late heartbeat is not enough to declare a node not ready.
    assert yard["NODE_NOT_READY_S"] > 2 * yard["HEARTBEAT_INTERVAL_S"]
    assert yard["NODE_NOT_READY_S"] < yard["NODE_DOWN_S"]


def test_a_node_that_heartbeats_stays_ready(nodes: list[Node]) -> None:
    nodes_check(now=timezone.now())
    assert state_of(nodes[0]) == NodeState.READY


def test_a_silent_node_goes_not_ready(nodes: list[Node]) -> None:
    silent_for(nodes[0], settings.YARD["NODE_NOT_READY_S"] + 1)
    assert nodes_check(now=timezone.now()).not_ready == [nodes[0].name]
    assert (state_of(nodes[0]), state_of(nodes[1])) == (NodeState.NOT_READY, NodeState.READY)


def test_a_node_never_heard_from_is_left_alone(nodes: list[Node]) -> None:
    Node.objects.filter(pk=nodes[0].pk).update(last_heartbeat=None, state=NodeState.NOT_READY)
    report = nodes_check(now=timezone.now() + timedelta(days=1))
    assert nodes[0].name not in report.down
    assert state_of(nodes[0]) == NodeState.NOT_READY


def test_a_node_silent_past_down_loses_its_gangs(nodes: list[Node], gang: Gang) -> None:
    first = gang([(nodes[0], [0, 1])])[0]
    silent_for(nodes[0], settings.YARD["NODE_DOWN_S"] + 1)
    report = nodes_check(now=timezone.now())
    assert report.down == [nodes[0].name] and report.requeued_jobs == [first.job_id]
    assert state_of(nodes[0]) == NodeState.DOWN
    job = Job.objects.get(pk=first.job_id)
    assert (job.state, job.attempt) == (JobState.PENDING, 2)
    assert set(Task.objects.filter(job=job).values_list("state", flat=True)) == {TaskState.LOST}
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_gangs_rank_on_a_live_node_stops_before_the_gang_is_requeued(
    nodes: list[Node], gang: Gang, other_agent: AgentClient
) -> None:
    lost, survivor = gang()  # rank 0 on the node that goes silent, rank 1 on a live one
    silent_for(nodes[0], settings.YARD["NODE_DOWN_S"] + 1)
    assert nodes_check(now=timezone.now()).requeued_jobs == [lost.job_id]
    job = Job.objects.get(pk=lost.job_id)
    # Not requeued yet: rank 1 may still run, and keeps its GPUs until its agent says it stopped.
    assert (job.state, job.attempt, job.stop_reason) == (JobState.STARTING, 1, "NODE_LOST")
    assert Task.objects.get(pk=survivor.pk).state == TaskState.STOPPING
    assert Allocation.objects.filter(task=survivor, released_at__isnull=True).count() == 2
    (spec,) = other_agent.post("heartbeat", heartbeat_body(tasks=[task_report(survivor)])).json()["desired"]
    assert spec["action"] == "stop"
    other_agent.post(f"tasks/{survivor.pk}/status", {"attempt": 1, "state": "running", "pid": 7})
    other_agent.post(f"tasks/{survivor.pk}/status", {"attempt": 1, "state": "exited", "signal": 15, "stopped_by": "sigterm"})
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PENDING, 2)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_second_check_requeues_nothing_more(nodes: list[Node], gang: Gang) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    silent_for(nodes[0], settings.YARD["NODE_DOWN_S"] + 1)
    nodes_check(now=timezone.now())
    assert nodes_check(now=timezone.now()).requeued_jobs == []
    assert Job.objects.get(pk=task.job_id).attempt == 2


def test_a_draining_node_goes_down_too(nodes: list[Node]) -> None:
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.DRAINING)
    silent_for(nodes[0], settings.YARD["NODE_DOWN_S"] + 1)
    nodes_check(now=timezone.now())
    assert state_of(nodes[0]) == NodeState.DOWN


def test_the_returning_agent_is_told_to_run_nothing_stale(agent: AgentClient, nodes: list[Node], gang: Gang) -> None:
    gang()
    silent_for(nodes[0], settings.YARD["NODE_DOWN_S"] + 1)
    nodes_check(now=timezone.now())
    assert agent.post("heartbeat", heartbeat_body()).json()["desired"] == []


def test_the_celery_task_runs_the_check(nodes: list[Node]) -> None:
    silent_for(nodes[0], settings.YARD["NODE_NOT_READY_S"] + 1)
    assert check_nodes.name == "scheduling.agent.tasks.check_nodes"
    assert check_nodes()["not_ready"] == [nodes[0].name]


@pytest.mark.django_db(transaction=True)
def test_concurrent_checks_requeue_a_lost_gang_exactly_once(nodes: list[Node], gang: Gang) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    silent_for(nodes[0], settings.YARD["NODE_DOWN_S"] + 1)
    start = threading.Barrier(3)
    reports = []

    def check() -> None:
        try:
            start.wait()
            reports.append(nodes_check(now=timezone.now()))
        finally:
            connection.close()

    threads = [threading.Thread(target=check) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(len(r.requeued_jobs) for r in reports) == [0, 0, 1]
    job = Job.objects.get(pk=task.job_id)
    assert (job.state, job.attempt) == (JobState.PENDING, 2)
    assert JobEvent.objects.filter(job=job, to_state=JobState.PENDING).count() == 1
