"""A task whose image could not be pulled: the agent says so (stop_cause image_pull, a message) and the job fails.

Never requeued and never retried: the registry would answer the next attempt as it answered this one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduling.models import Allocation, Job, Task
from scheduling.states import JobState, TaskState
from tenants.models import Role
from tests.agent_api.conftest import AgentClient
from tests.agent_api.test_status import exited
from tests.factories import make_user

Gang = Callable[..., list[Task]]
MESSAGE = "image pull failed: 127.0.0.1:5000/x:1: no such image (manifest unknown)"


def pull_failed(task: Task) -> dict[str, object]:
    return exited(task, exit_code=None, stop_cause="image_pull", message=MESSAGE)


def test_a_failed_pull_fails_the_job_with_the_agents_message(agent: AgentClient, gang: Gang) -> None:
    (task,) = gang(ranks=[(agent_node(agent), [0])], image="127.0.0.1:5000/x:1")
    response = agent.post(f"tasks/{task.pk}/status", pull_failed(task))
    assert response.status_code == 200, response.content
    job = Job.objects.get(pk=task.job_id)
    assert (job.state, job.stop_reason, job.attempt) == (JobState.FAILED, "IMAGE_PULL", 1)
    assert MESSAGE in job.stop_message
    last = job.events.order_by("-time", "-id").first()
    assert last is not None and last.to_state == JobState.FAILED and MESSAGE in last.reason
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_failed_pull_on_one_rank_stops_the_others_and_the_job_still_fails(
    agent: AgentClient, other_agent: AgentClient, gang: Gang
) -> None:
    first, second = gang(image="127.0.0.1:5000/x:1")
    agent.post(f"tasks/{first.pk}/status", pull_failed(first))
    second.refresh_from_db()
    assert second.state == TaskState.STOPPING
    other_agent.post(f"tasks/{second.pk}/status", exited(second, exit_code=None, signal=15, stopped_by="sigterm"))
    job = Job.objects.get(pk=first.job_id)
    assert (job.state, job.stop_reason, job.attempt) == (JobState.FAILED, "IMAGE_PULL", 1)
    assert not Job.objects.filter(pk=job.pk, state=JobState.PENDING).exists()


def test_a_repeated_pull_failure_report_changes_nothing(agent: AgentClient, gang: Gang) -> None:
    (task,) = gang(ranks=[(agent_node(agent), [0])], image="127.0.0.1:5000/x:1")
    agent.post(f"tasks/{task.pk}/status", pull_failed(task))
    events = Job.objects.get(pk=task.job_id).events.count()
    assert agent.post(f"tasks/{task.pk}/status", pull_failed(task)).status_code == 200
    job = Job.objects.get(pk=task.job_id)
    assert (job.state, job.attempt, job.events.count()) == (JobState.FAILED, 1, events)


def test_the_api_job_detail_shows_the_pull_message(agent: AgentClient, gang: Gang) -> None:
    from rest_framework.test import APIClient

    (task,) = gang(ranks=[(agent_node(agent), [0])], image="127.0.0.1:5000/x:1")
    agent.post(f"tasks/{task.pk}/status", pull_failed(task))
    client = APIClient()
    client.force_login(Job.objects.get(pk=task.job_id).user)
    body = client.get(f"/api/v1/jobs/{task.job_id}").json()
    assert (body["state"], body["stop_reason"], body["image"]) == ("FAILED", "IMAGE_PULL", "127.0.0.1:5000/x:1")
    assert MESSAGE in body["stop_message"]
    assert any(MESSAGE in e["reason"] for e in body["events"])


def test_a_message_longer_than_1000_characters_is_refused_naming_it(agent: AgentClient, gang: Gang) -> None:
    (task,) = gang(ranks=[(agent_node(agent), [0])])
    response = agent.post(f"tasks/{task.pk}/status", exited(task, message="x" * 1001))
    assert response.status_code == 400
    assert "message" in response.content.decode()


def agent_node(agent: AgentClient) -> object:
    from scheduling.models import Node
    from tenants.models import hash_token

    assert agent.token is not None
    return Node.objects.get(token_hash=hash_token(agent.token))


# --------------------------------------------------------------------------- the container entry of a task spec


def test_a_host_job_spec_has_no_container(agent: AgentClient, gang: Gang) -> None:
    gang(ranks=[(agent_node(agent), [0])])
    (spec,) = agent.post("heartbeat", {"gpus": [], "tasks": []}).json()["desired"]
    assert "container" not in spec


def test_a_job_with_an_image_carries_its_container_and_its_teams_credential(agent: AgentClient, gang: Gang, org: Any) -> None:
    from scheduling.registry_credentials import credential_set

    lead = make_user("lead", unit=org.team_a, role=Role.TEAM_LEAD)
    credential_set(actor=lead, unit=org.dept, registry="nvcr.io", username="$oauthtoken", password="dept-secret")
    credential_set(actor=lead, unit=org.team_a, registry="nvcr.io", username="$oauthtoken", password="team-secret")
    credential_set(actor=lead, unit=org.team_a, registry="ghcr.io", username="me", password="other-registry")
    mounts = [{"source": "/data", "target": "/data", "readonly": True}]
    gang(
        ranks=[(agent_node(agent), [0])],
        image="nvcr.io/nvidia/pytorch:24.05-py3",
        container_mounts=mounts,
        container_workdir="/workspace",
    )
    (spec,) = agent.post("heartbeat", {"gpus": [], "tasks": []}).json()["desired"]
    assert spec["container"] == {
        "image": "nvcr.io/nvidia/pytorch:24.05-py3",
        "mounts": mounts,
        "workdir": "/workspace",
        "auth": {"username": "$oauthtoken", "password": "team-secret"},
    }


def test_a_team_without_its_own_credential_gets_its_departments(agent: AgentClient, gang: Gang, org: Any) -> None:
    from scheduling.registry_credentials import credential_set

    admin = make_user("rita", unit=org.bu, role=Role.ORG_ADMIN)
    credential_set(actor=admin, unit=org.dept, registry="registry.corp:5000", username="vision", password="dept-secret")
    gang(ranks=[(agent_node(agent), [0])], image="registry.corp:5000/ml/train:1")
    (spec,) = agent.post("heartbeat", {"gpus": [], "tasks": []}).json()["desired"]
    assert spec["container"]["auth"] == {"username": "vision", "password": "dept-secret"}
    assert spec["container"]["workdir"] is None and spec["container"]["mounts"] == []


def test_no_credential_for_the_images_registry_is_no_auth(agent: AgentClient, gang: Gang, org: Any) -> None:
    from scheduling.registry_credentials import credential_set

    admin = make_user("rita", unit=org.bu, role=Role.ORG_ADMIN)
    credential_set(actor=admin, unit=org.team_b, registry="nvcr.io", username="b", password="team-b-secret")
    gang(ranks=[(agent_node(agent), [0])], image="nvcr.io/nvidia/pytorch:24.05-py3")
    (spec,) = agent.post("heartbeat", {"gpus": [], "tasks": []}).json()["desired"]
    assert spec["container"]["auth"] is None  # team_b's credential is not team_a's


def test_a_running_task_is_sent_no_password(agent: AgentClient, gang: Gang, org: Any) -> None:
    from django.utils import timezone

    from scheduling.registry_credentials import credential_set
    from scheduling.services import task_mark_running

    admin = make_user("rita", unit=org.bu, role=Role.ORG_ADMIN)
    credential_set(actor=admin, unit=org.team_a, registry="nvcr.io", username="a", password="team-secret")
    (task,) = gang(ranks=[(agent_node(agent), [0])], image="nvcr.io/nvidia/pytorch:24.05-py3")
    task_mark_running(task=task, pid=4242, started_at=timezone.now())
    response = agent.post("heartbeat", {"gpus": [], "tasks": []})
    (spec,) = response.json()["desired"]
    assert spec["container"]["auth"] is None
    assert b"team-secret" not in response.content
