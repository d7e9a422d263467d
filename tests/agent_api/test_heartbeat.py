"""POST heartbeat: liveness, telemetry, task facts, and the desired list the agent reconciles to."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.models import Allocation, Gpu, GpuWindow, Job, Node, NodeState, Task, XidEvent
from scheduling.services import job_request_stop, node_mark_lost, task_mark_running
from scheduling.states import JobState, TaskState
from tests.agent_api.conftest import AgentClient, heartbeat_body, task_report

Gang = Callable[..., list[Task]]


def sample(index: int, util: float | None = 50.0, **fields: object) -> dict[str, object]:
    body: dict[str, object] = {
        "uuid": f"GPU-x-{index}",
        "index": index,
        "utilization_pct": util,
        "memory_used_mb": 1000.0,
        "temperature_c": 60,
        "power_w": 300.5,
        "xid_errors": [],
    }
    body.update(fields)
    return body


def test_heartbeat_records_the_time(agent: AgentClient, nodes: list[Node]) -> None:
    before = timezone.now()
    assert agent.post("heartbeat", heartbeat_body()).status_code == 200
    nodes[0].refresh_from_db()
    assert nodes[0].last_heartbeat is not None and nodes[0].last_heartbeat >= before


def test_a_not_ready_node_is_ready_again_on_its_heartbeat(agent: AgentClient, nodes: list[Node]) -> None:
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.NOT_READY)
    assert agent.post("heartbeat", heartbeat_body()).json()["node_state"] == NodeState.READY
    assert Node.objects.get(pk=nodes[0].pk).state == NodeState.READY


def test_a_down_node_stays_down_while_it_runs_stale_work(agent: AgentClient, nodes: list[Node], gang: Gang) -> None:
    tasks = gang()
    node_mark_lost(node=nodes[0], reason="test")
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.DOWN)
    body = agent.post("heartbeat", heartbeat_body(tasks=[task_report(tasks[0])])).json()
    assert body["node_state"] == NodeState.DOWN
    assert body["desired"] == []  # the agent fences the stale task


def test_a_down_node_is_ready_once_its_stale_work_is_gone(agent: AgentClient, nodes: list[Node], gang: Gang) -> None:
    tasks = gang()
    node_mark_lost(node=nodes[0], reason="test")
    Node.objects.filter(pk=nodes[0].pk).update(state=NodeState.DOWN)
    body = agent.post("heartbeat", heartbeat_body(tasks=[task_report(tasks[0], state="exited")])).json()
    assert body["node_state"] == NodeState.READY


def test_heartbeat_stores_the_latest_telemetry(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[sample(0, 97.0), sample(1, None)]))
    gpu0, gpu1 = Gpu.objects.filter(node=nodes[0], index__in=[0, 1]).order_by("index")
    assert (gpu0.utilization_pct, gpu0.memory_used_mb, gpu0.temperature_c, gpu0.power_w) == (97.0, 1000.0, 60.0, 300.5)
    assert gpu1.utilization_pct is None and gpu1.telemetry_at is not None


def test_heartbeats_fold_into_one_minute_windows(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[sample(0, 20.0, memory_used_mb=500.0)]))
    agent.post("heartbeat", heartbeat_body(gpus=[sample(0, 80.0, memory_used_mb=300.0)]))
    windows = list(GpuWindow.objects.filter(gpu__node=nodes[0], gpu__index=0))
    # Two heartbeats may straddle a minute boundary; then each window holds one sample.
    assert sum(w.samples for w in windows) == 2
    assert sum(w.utilization_sum for w in windows) == 100.0
    assert max(w.utilization_max for w in windows) == 80.0
    assert max(w.memory_used_max_mb for w in windows) == 500.0
    assert all(w.start.second == 0 and w.start.microsecond == 0 for w in windows)


def test_xid_errors_become_events(agent: AgentClient, nodes: list[Node]) -> None:
    agent.post("heartbeat", heartbeat_body(gpus=[sample(3, xid_errors=[79, 48])]))
    assert sorted(XidEvent.objects.filter(gpu__node=nodes[0], gpu__index=3).values_list("code", flat=True)) == [48, 79]


def test_checkpoint_time_reaches_the_task_and_the_job(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, checkpoint_time=1796012345.5)]))
    expected = datetime.fromtimestamp(1796012345.5, tz=UTC)
    assert Task.objects.get(pk=task.pk).checkpoint_at == expected
    assert Job.objects.get(pk=task.job_id).last_checkpoint_at == expected


def test_an_older_checkpoint_does_not_move_the_job_back(agent: AgentClient, other_agent: AgentClient, gang: Gang) -> None:
    first, second = gang()
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(first, checkpoint_time=2000.0)]))
    other_agent.post("heartbeat", heartbeat_body(tasks=[task_report(second, checkpoint_time=1000.0)]))
    assert Job.objects.get(pk=first.job_id).last_checkpoint_at == datetime.fromtimestamp(2000.0, tz=UTC)


def test_notebook_activity_reaches_the_task(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0])], kind="notebook")[0]
    notebook = {"url": "http://127.0.0.1:41873/?token=t", "kernel_busy": False, "last_activity": 1796012001.5}
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, notebook=notebook)]))
    task.refresh_from_db()
    assert task.notebook_url == notebook["url"] and task.notebook_kernel_busy is False
    assert task.notebook_last_activity == datetime.fromtimestamp(1796012001.5, tz=UTC)


def test_a_draining_reason_drains_the_node(agent: AgentClient, nodes: list[Node]) -> None:
    body = agent.post("heartbeat", heartbeat_body(draining_reason="task 1 survived SIGKILL")).json()
    assert body["node_state"] == NodeState.DRAINING
    assert Node.objects.get(pk=nodes[0].pk).state_reason == "task 1 survived SIGKILL"


def test_desired_carries_each_rank_its_spec(agent: AgentClient, other_agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    first, second = gang(env={"WANDB_MODE": "offline"}, command="python train.py", checkpoint_dir="/ckpt/j")
    (spec,) = other_agent.post("heartbeat", heartbeat_body()).json()["desired"]
    assert spec == {
        "task_id": second.pk,
        "job_id": second.job_id,
        "attempt": 1,
        "user": "alice",
        "kind": "batch",
        "rank": 1,
        "world_size": 2,
        "node_rank": 1,
        "local_rank": 0,
        "master_addr": nodes[0].address,
        "master_port": 29511,
        "gpus": [2, 3],
        "command": "python train.py",
        "env": {"WANDB_MODE": "offline"},
        "checkpoint_dir": "/ckpt/j",
        "time_limit_s": 86400,
        "action": "run",
        "grace_s": 60.0,
        "stop_reason": None,
    }
    assert [s["task_id"] for s in agent.post("heartbeat", heartbeat_body()).json()["desired"]] == [first.pk]


def test_a_stop_order_is_a_stop_action_with_its_grace(agent: AgentClient, gang: Gang) -> None:
    task = gang()[0]
    task_mark_running(task=task, pid=4242, started_at=timezone.now())
    job_request_stop(job=Job.objects.get(pk=task.job_id), reason="PREEMPTED", grace_s=7, actor_label="scheduler")
    (spec,) = agent.post("heartbeat", heartbeat_body(tasks=[task_report(task)])).json()["desired"]
    assert (spec["action"], spec["grace_s"], spec["stop_reason"]) == ("stop", 7, "PREEMPTED")


def test_a_rank_stopped_before_its_agent_started_it_ends(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    job_request_stop(job=task.job, reason="CANCELLED", actor_label="ann")
    # The agent never saw the task: its complete task list does not hold it.
    assert agent.post("heartbeat", heartbeat_body()).json()["desired"] == []
    task.refresh_from_db()
    assert task.state == TaskState.EXITED
    assert not Allocation.objects.filter(task=task, released_at__isnull=True).exists()
    assert Job.objects.get(pk=task.job_id).state == JobState.CANCELLED


def test_a_rank_the_agent_reports_is_not_ended_by_the_stop_order(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    task = gang([(nodes[0], [0, 1])])[0]
    job_request_stop(job=task.job, reason="CANCELLED", actor_label="ann")
    # Started between the portal's answer and the stop order: the agent reports it, so it is stopped, not dropped.
    (spec,) = agent.post("heartbeat", heartbeat_body(tasks=[task_report(task)])).json()["desired"]
    assert spec["action"] == "stop"
    task.refresh_from_db()
    assert task.state == TaskState.STOPPING


def test_ended_and_lost_tasks_leave_desired(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    ended = gang([(nodes[0], [0])])[0]
    Task.objects.filter(pk=ended.pk).update(state=TaskState.EXITED)
    lost = gang([(nodes[0], [1])])[0]
    Task.objects.filter(pk=lost.pk).update(state=TaskState.LOST)
    assert agent.post("heartbeat", heartbeat_body()).json()["desired"] == []


def _heartbeat_queries(agent: AgentClient, tasks: list[Task], gpus: int) -> int:
    body = heartbeat_body(
        gpus=[sample(i, xid_errors=[13]) for i in range(gpus)],  # an application XID: recorded, drains nothing
        tasks=[task_report(t, checkpoint_time=1796012345.0 + t.pk) for t in tasks],
    )
    with CaptureQueriesContext(connection) as queries:
        assert agent.post("heartbeat", body).status_code == 200
    return len(queries)


def test_heartbeat_queries_do_not_grow_with_tasks_or_gpus(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    one = gang([(nodes[0], [0])])
    small = _heartbeat_queries(agent, one, gpus=1)
    many = one + [gang([(nodes[0], [i])])[0] for i in range(1, 8)]
    large = _heartbeat_queries(agent, many, gpus=8)
    assert large == small
    assert small <= 14
