"""The agent against the REAL portal (Django's live server, PostgreSQL): enrol, run a gang, fence.

The agent runs in a thread of the test process and speaks HTTP to the live server, as on a node.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent import Agent
from nodeagent.config import AgentConfig
from nodeagent.simgpu import SimulatedGpus, gpus_from_spec
from tests.nodeagent.conftest import kill_group

pytestmark = pytest.mark.django_db(transaction=True)

ENROLMENT = "yen_integration-enrolment-token"


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


THREADS: dict[int, threading.Thread] = {}  # id(agent) -> the thread its loop runs in


@pytest.fixture
def agents(live_server: Any, settings: Any, tmp_path: Path) -> Iterator[Callable[[str, str], Agent]]:
    # The agent adopts the portal's interval; the default 10 s would make these tests slow.
    settings.YARD = {**settings.YARD, "HEARTBEAT_INTERVAL_S": 0.5}
    from scheduling.models import EnrolmentToken
    from tenants.models import hash_token

    EnrolmentToken.objects.create(name="tests", token_hash=hash_token(ENROLMENT), max_uses=100)
    started: list[tuple[Agent, threading.Thread]] = []

    def start(name: str, leaf: str) -> Agent:
        config = AgentConfig(
            portal=live_server.url,
            token=ENROLMENT,
            name=name,
            address="127.0.0.1",
            leaf=leaf,
            spine="spine-0",
            state_dir=tmp_path / name,
            heartbeat_interval_s=0.5,
            tick_s=0.1,
        )
        agent = Agent(config, SimulatedGpus(gpus_from_spec("8xH100", node=name)))
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        started.append((agent, thread))
        THREADS[id(agent)] = thread
        return agent

    yield start
    for agent, thread in started:
        agent.stop_event.set()
        thread.join(timeout=10)
        for record in agent.records.values():
            if record.pid is not None:
                kill_group(record.pid)


def _submit(command: str, *, replicas: int) -> Any:
    from scheduling.services import JobSpec, job_submit
    from tests.factories import make_org, make_user

    org = make_org()
    user = make_user("ann", unit=org.team_a)
    return job_submit(
        user=user,
        spec=JobSpec(
            name="gang",
            team=org.team_a,
            replicas=replicas,
            gpus_per_replica=8,
            gpu_type="H100",
            command=command,
            time_limit_s=600,
        ),
    )


def test_enrolled_agents_run_a_two_node_gang_to_completion(agents: Callable[[str, str], Agent]) -> None:
    from scheduling.cycle import run_cycle_once
    from scheduling.models import Node, Task, TaskLogChunk

    for name in ("int-n1", "int-n2"):
        agents(name, "leaf-0")
    wait_for(lambda: Node.objects.filter(state="READY").count() == 2, what="two READY nodes")
    job = _submit('echo "rank $RANK/$WORLD_SIZE gpus $CUDA_VISIBLE_DEVICES"', replicas=2)
    assert run_cycle_once().placed == [job.pk]

    def done() -> bool:
        job.refresh_from_db()
        return job.state == "COMPLETED"

    wait_for(done, what="the job completed")
    logs = sorted(
        "".join(c.data for c in TaskLogChunk.objects.filter(task=task).order_by("offset"))
        for task in Task.objects.filter(job=job)
    )
    assert logs == ["rank 0/2 gpus 0,1,2,3,4,5,6,7\n", "rank 1/2 gpus 0,1,2,3,4,5,6,7\n"]


def test_cancelling_a_job_stops_its_processes_gracefully(agents: Callable[[str, str], Agent]) -> None:
    from scheduling.cycle import run_cycle_once
    from scheduling.models import Node, Task
    from scheduling.services import job_cancel

    agent = agents("int-n3", "leaf-0")
    wait_for(lambda: Node.objects.filter(state="READY").exists(), what="a READY node")
    job = _submit("trap 'echo saved; exit 0' TERM; while :; do sleep 0.1; done", replicas=1)
    run_cycle_once()
    task = Task.objects.get(job=job)
    record = wait_for(lambda: agent.records.get((task.pk, task.attempt)), what="the task started")
    wait_for(lambda: record.running_reported, what="the start reported")
    job_cancel(actor=job.user, job=job)
    wait_for(lambda: record.settled, what="the task stopped and reported")
    assert (record.stopped_by, record.stop_cause) == ("sigterm", "stop")


def test_an_agent_back_from_down_kills_the_work_the_portal_requeued(agents: Callable[[str, str], Agent]) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from nodeagent.launcher import group_alive
    from scheduling.agent.liveness import nodes_check
    from scheduling.cycle import run_cycle_once
    from scheduling.models import Node, Task

    first = agents("int-n4", "leaf-0")
    wait_for(lambda: Node.objects.filter(state="READY").exists(), what="a READY node")
    job = _submit("exec sleep 60", replicas=1)
    run_cycle_once()
    task = Task.objects.get(job=job)
    record = wait_for(lambda: first.records.get((task.pk, task.attempt)), what="the task started")
    wait_for(lambda: record.running_reported, what="the start reported")
    first.stop_event.set()  # the agent vanishes (a partition); its workload runs on
    wait_for(lambda: not THREADS[id(first)].is_alive(), what="the first agent's loop ended")
    assert nodes_check(now=timezone.now() + timedelta(seconds=600)).requeued_jobs == [job.pk]
    second = agents("int-n4", "leaf-0")
    stale = wait_for(lambda: second.records.get((task.pk, task.attempt)), what="the workload adopted")
    wait_for(lambda: stale.settled, what="the stale workload fenced")
    assert stale.stop_cause == "fenced" and not group_alive(stale.pid)
