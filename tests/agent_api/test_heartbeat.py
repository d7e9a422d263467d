"""POST heartbeat: liveness, telemetry, task facts, and the desired list the agent reconciles to."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling.models import Allocation, Gpu, GpuWindow, Job, Node, NodeState, Task, XidEvent
from scheduling.notebook_secrets import Server, open_url
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


def test_the_agent_api_carries_no_content_security_policy_but_pages_do(agent: AgentClient, client: Client) -> None:
    # A policy guards what a browser renders; agents read the agent API's JSON, so it is left off there
    # (portal.middleware.ContentSecurityPolicyMiddleware), and kept on everything a browser may load.
    answer = agent.post("heartbeat", heartbeat_body())
    assert answer.status_code == 200 and "Content-Security-Policy" not in answer.headers
    page = client.get("/accounts/login/")
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    api = client.get("/api/v1/jobs")
    assert "Content-Security-Policy" in api.headers


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


def window(index: int, start: float, samples: int, util_sum: float, util_max: float, mem: float = 0.0) -> dict[str, object]:
    return {
        "index": index,
        "start": start,
        "samples": samples,
        "utilization_sum": util_sum,
        "utilization_max": util_max,
        "memory_used_max_mb": mem,
    }


def test_the_agents_minute_windows_are_stored_as_the_orm_reads_them(agent: AgentClient, nodes: list[Node]) -> None:
    minute = datetime(2026, 12, 1, 9, 54, tzinfo=UTC)
    agent.post("heartbeat", heartbeat_body(windows=[window(0, minute.timestamp(), 6, 120.0, 80.0, 500.0)]))
    (stored,) = GpuWindow.objects.filter(gpu__node=nodes[0], gpu__index=0)
    assert (stored.start, stored.samples, stored.utilization_sum, stored.utilization_max) == (minute, 6, 120.0, 80.0)
    # What the idle reaper asks for: the window by its start, as the ORM compares times.
    assert GpuWindow.objects.filter(gpu__node=nodes[0], start=minute).count() == 1
    assert GpuWindow.objects.filter(gpu__node=nodes[0], start__gte=minute).count() == 1


def test_a_resent_window_overwrites_rather_than_adds(agent: AgentClient, nodes: list[Node]) -> None:
    start = 1796012040.0  # a whole minute
    body = heartbeat_body(windows=[window(1, start, 6, 300.0, 60.0)])
    agent.post("heartbeat", body)
    agent.post("heartbeat", body)  # the answer was lost: the agent sends the minute again
    (stored,) = GpuWindow.objects.filter(gpu__node=nodes[0], gpu__index=1)
    assert (stored.samples, stored.utilization_sum) == (6, 300.0)


def test_a_heartbeat_without_telemetry_writes_no_gpu_row(agent: AgentClient, nodes: list[Node]) -> None:
    with CaptureQueriesContext(connection) as queries:
        assert agent.post("heartbeat", heartbeat_body()).status_code == 200
    writes = [q["sql"] for q in queries.captured_queries if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE"))]
    assert writes == [w for w in writes if "scheduling_node" in w]  # only the liveness update


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
    # Kept without its token in the clear (scheduling/notebook_secrets.py; tests/agent_api/test_notebook_tokens.py).
    assert open_url(task.notebook_url) == Server(base="http://127.0.0.1:41873/", token="t")
    assert "token=t" not in task.notebook_url and task.notebook_kernel_busy is False
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
        "master_port": first.master_port,
        "job_name": second.job.name,
        "nodes": [[nodes[0].name, nodes[0].address], [nodes[1].name, nodes[1].address]],
        "gpus": [2, 3],
        "cpus": second.job.cpus_per_replica,
        "memory_mb": second.job.memory_mb_per_replica,
        "command": "python train.py",
        "env": {"WANDB_MODE": "offline"},
        "checkpoint_dir": "/ckpt/j",
        "time_limit_s": 86400,
        "action": "run",
        "grace_s": 60.0,
        "stop_reason": None,
        "started": False,
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


def test_a_steady_heartbeat_of_eight_running_tasks_costs_four_queries(agent: AgentClient, gang: Gang, nodes: list[Node]) -> None:
    tasks = [gang([(nodes[0], [i])])[0] for i in range(8)]
    reports = [task_report(t, started_at=1796012000.0) for t in tasks]
    agent.post("heartbeat", heartbeat_body(tasks=reports))  # starts them: the writes of a change
    with CaptureQueriesContext(connection) as queries:
        body = agent.post("heartbeat", heartbeat_body(tasks=reports)).json()
    assert all(spec["started"] for spec in body["desired"])
    # token lookup, liveness UPDATE, the live tasks with their jobs (the savepoints are BEGIN/COMMIT outside a test).
    statements = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
    assert len(statements) <= 3, [q[:80] for q in statements]


def test_tasks_placed_before_gpu_indices_existed_get_them_from_their_allocations(
    agent: AgentClient, gang: Gang, nodes: list[Node]
) -> None:
    task = gang([(nodes[0], [3, 5])])[0]
    Task.objects.filter(pk=task.pk).update(gpu_indices=[])
    (spec,) = agent.post("heartbeat", heartbeat_body()).json()["desired"]
    assert spec["gpus"] == [3, 5]


def test_ranks_reported_started_in_heartbeats_start_the_gang_once_all_run(
    agent: AgentClient, other_agent: AgentClient, gang: Gang
) -> None:
    first, second = gang()
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(first, started_at=1796012000.0, pid=11)]))
    assert Task.objects.get(pk=first.pk).state == TaskState.RUNNING
    assert Task.objects.get(pk=first.pk).pid == 11
    assert Job.objects.get(pk=first.job_id).state == JobState.STARTING  # rank 1 has not started yet
    other_agent.post("heartbeat", heartbeat_body(tasks=[task_report(second, started_at=1796012001.0)]))
    job = Job.objects.get(pk=first.job_id)
    assert job.state == JobState.RUNNING and job.started_at is not None
    assert job.events.filter(to_state=JobState.RUNNING).count() == 1


def test_a_report_without_a_start_time_does_not_start_a_task(agent: AgentClient, gang: Gang) -> None:
    # Older agents report starts through the status call; a heartbeat that only lists the task leaves it ASSIGNED.
    task = gang()[0]
    agent.post("heartbeat", heartbeat_body(tasks=[task_report(task)]))
    assert Task.objects.get(pk=task.pk).state == TaskState.ASSIGNED


def test_the_compiled_live_task_query_gives_what_the_orm_gives(gang: Gang, nodes: list[Node]) -> None:
    from scheduling.agent.services.live_tasks import _LIVE_TASKS, live_tasks_queryset

    tasks = [gang([(nodes[0], [i])], env={"A": str(i)}, command=f"run {i}")[0] for i in range(3)]
    Task.objects.filter(pk=tasks[1].pk).update(state=TaskState.RUNNING, checkpoint_at=timezone.now(), notebook_url="u")
    fast = _LIVE_TASKS.objects(nodes[0].pk)
    slow = list(live_tasks_queryset(nodes[0].pk))
    assert [t.pk for t in fast] == [t.pk for t in slow] == sorted(t.pk for t in tasks)

    def seen(t: Task) -> tuple[object, ...]:
        return (
            t.pk, t.state, t.master_port, t.gpu_indices, t.checkpoint_at, t.notebook_url,
            t.job.pk, t.job.command, t.job.env, t.job.state, t.job.user.username,
        )  # fmt: skip

    assert [seen(t) for t in fast] == [seen(t) for t in slow]

    def attributes(obj: object) -> dict[str, object]:
        # Every loaded field, and the absence of every deferred one, exactly as Django's from_db leaves them.
        state = obj._state  # type: ignore[attr-defined]
        return {k: v for k, v in vars(obj).items() if k != "_state"} | {"adding": state.adding, "db": state.db}

    for f, s in zip(fast, slow, strict=True):
        assert attributes(f) == attributes(s)
        assert attributes(f.job) == attributes(s.job)
        assert attributes(f.job.user) == attributes(s.job.user)
        assert f.get_deferred_fields() == s.get_deferred_fields() != set()
        assert f.job.get_deferred_fields() == s.job.get_deferred_fields()
    with CaptureQueriesContext(connection) as queries:
        [t.job.user.username for t in _LIVE_TASKS.objects(nodes[0].pk)]
    assert len(queries) == 1  # jobs and owners came with the tasks
    assert _LIVE_TASKS.objects(nodes[1].pk) == []  # another node's id, the same compiled query
