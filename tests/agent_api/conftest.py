"""Fixtures for the agent API tests: a small cluster whose nodes hold tokens, placed gangs, a client."""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from scheduling.models import Allocation, EnrolmentToken, Gpu, Job, Node, Task
from scheduling.services import job_transition
from scheduling.states import JobState
from tenants.models import hash_token
from tests.factories import make_cluster, make_job, make_org, make_user

API = "/api/agent/v1/"


def issue_node_token(node: Node) -> str:
    raw = "ynd_" + secrets.token_urlsafe(30)
    Node.objects.filter(pk=node.pk).update(token_hash=hash_token(raw))
    return raw


def issue_enrolment_token(**fields: Any) -> str:
    raw = "yen_" + secrets.token_urlsafe(30)
    # Fleets in the tests register many nodes with one token (a real one registers one by default).
    fields.setdefault("max_uses", 1000)
    EnrolmentToken.objects.create(name="test", token_hash=hash_token(raw), **fields)
    return raw


class AgentClient:
    """POSTs JSON to the agent API with a bearer token, as nodeagent.client does."""

    def __init__(self, token: str | None) -> None:
        self.token = token
        self.http = Client()

    def post(self, path: str, body: Any) -> Any:
        headers = {"HTTP_AUTHORIZATION": f"Bearer {self.token}"} if self.token else {}
        return self.http.post(API + path, data=json.dumps(body), content_type="application/json", **headers)


def place(job: Job, ranks: Sequence[tuple[Node, Sequence[int]]]) -> list[Task]:
    """Assign the job's attempt to GPUs as a cycle would: STARTING, one task per rank, live allocations."""
    job_transition(job=job, to=JobState.STARTING, reason="placed by the test", actor_label="scheduler")
    master = ranks[0][0].address
    tasks = []
    for rank, (node, indices) in enumerate(ranks):
        # A port per job, as the cycle picks one (a constraint keeps them apart on a node).
        task = Task.objects.create(
            job=job, attempt=job.attempt, rank=rank, node=node, master_addr=master, master_port=29500 + job.pk % 500,
            gpu_indices=sorted(indices),
        )  # fmt: skip
        gpus = Gpu.objects.filter(node=node, index__in=indices)
        Allocation.objects.bulk_create(Allocation(gpu=g, task=task, job=job, attempt=job.attempt) for g in gpus)
        tasks.append(task)
    return tasks


@pytest.fixture
def org(db: None) -> Any:
    return make_org()


@pytest.fixture
def user(org: Any) -> Any:
    return make_user("alice", unit=org.team_a)


@pytest.fixture
def nodes(db: None) -> list[Node]:
    cluster = make_cluster(nodes=2)
    Node.objects.update(last_heartbeat=timezone.now())
    for node in cluster:
        node.refresh_from_db()
    return cluster


@pytest.fixture
def agent(nodes: list[Node]) -> AgentClient:
    """The first node's agent."""
    return AgentClient(issue_node_token(nodes[0]))


@pytest.fixture
def other_agent(nodes: list[Node]) -> AgentClient:
    return AgentClient(issue_node_token(nodes[1]))


@pytest.fixture
def gang(org: Any, user: Any, nodes: list[Node]) -> Callable[..., list[Task]]:
    """A job of len(ranks) replicas placed on (node, GPU indices) pairs; defaults to 2 ranks × 2 GPUs."""

    def make(ranks: Sequence[tuple[Node, Sequence[int]]] | None = None, **fields: Any) -> list[Task]:
        ranks = ranks or [(nodes[0], [0, 1]), (nodes[1], [2, 3])]
        fields.setdefault("gpus_per_replica", len(ranks[0][1]))
        job = make_job(team=org.team_a, user=user, replicas=len(ranks), **fields)
        return place(job, ranks)

    return make


def heartbeat_body(*, gpus: Sequence[dict[str, Any]] = (), tasks: Sequence[dict[str, Any]] = (), **extra: Any) -> dict[str, Any]:
    return {"gpus": list(gpus), "tasks": list(tasks), "draining_reason": None, **extra}


def task_report(task: Task, **fields: Any) -> dict[str, Any]:
    report = {"task_id": task.pk, "attempt": task.attempt, "state": "running", "pid": 4242}
    return {**report, "checkpoint_time": None, "notebook": None, **fields}
