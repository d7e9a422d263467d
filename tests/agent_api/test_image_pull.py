"""A task whose image could not be pulled: the agent says so (stop_cause image_pull, a message) and the job fails.

Never requeued and never retried: the registry would answer the next attempt as it answered this one.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduling.models import Allocation, Job, Task
from scheduling.states import JobState, TaskState
from tests.agent_api.conftest import AgentClient
from tests.agent_api.test_status import exited

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
