"""A service replica's report in the heartbeat: stored on its task, bounded, and its spec in `desired`."""

from __future__ import annotations

from typing import Any

from scheduling.models import Job, JobKind, Node, Service, ServiceRevision, Task
from scheduling.states import JobState
from tests.agent_api.conftest import AgentClient, heartbeat_body, place, task_report
from tests.factories import make_job


def _replica(org: Any, user: Any, node: Node) -> Task:
    service = Service.objects.create(
        name="chat", team=org.team_a, user=user, gpu_type="H100", readiness_path="/ready", liveness_path="/live",
        probe_period_s=0.5, failure_threshold=2,
    )  # fmt: skip
    ServiceRevision.objects.create(service=service, number=1, command="serve")
    job = make_job(team=org.team_a, user=user, kind=JobKind.SERVICE, service=service, service_revision=1, time_limit_s=0)
    (task,) = place(job, [(node, [0])])
    return task


SERVICE = {
    "url": "http://10.0.0.1:20001",
    "ready": True,
    "live": True,
    "restarts": 2,
    "last_restart_at": 1_780_000_000.0,
    "last_exit_code": 1,
    "crash_looping": False,
    "message": "restart 2 after exit code 1",
}


def test_the_report_is_stored_on_the_task_and_desired_carries_the_probes(
    agent: AgentClient, nodes: list[Node], org, user
) -> None:
    task = _replica(org, user, nodes[0])
    answer = agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, started_at=1_780_000_000.0, service=SERVICE)]))
    assert answer.status_code == 200, answer.json()
    task.refresh_from_db()
    assert (task.service_url, task.service_ready, task.service_restarts, task.service_message) == (
        "http://10.0.0.1:20001", True, 2, "restart 2 after exit code 1"
    )  # fmt: skip
    (spec,) = answer.json()["desired"]
    assert spec["kind"] == "service" and spec["time_limit_s"] is None
    assert spec["service"]["readiness_path"] == "/ready" and spec["service"]["liveness_path"] == "/live"
    assert spec["service"]["period_s"] == 0.5 and spec["service"]["failure_threshold"] == 2
    assert Job.objects.get(pk=task.job_id).state in (JobState.STARTING, JobState.RUNNING)


def test_a_report_out_of_bounds_is_refused_naming_the_field(agent: AgentClient, nodes: list[Node], org, user) -> None:
    task = _replica(org, user, nodes[0])
    bad = {**SERVICE, "restarts": -1, "message": "x" * 1001}
    answer = agent.post("heartbeat", heartbeat_body(tasks=[task_report(task, service=bad)]))
    assert answer.status_code == 400
    fields = answer.json()["errors"]
    assert "tasks[0].service.restarts" in fields and "tasks[0].service.message" in fields
    task.refresh_from_db()
    assert task.service_restarts == 0
