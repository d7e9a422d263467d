"""Services against real PostgreSQL: an org, a cluster, and a hand that plays the agents' part (a replica
placed by the real cycle is marked started and ready as its agent's heartbeat would)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Service, Task
from scheduling.serving.controller import reconcile
from scheduling.serving.services import ServiceSpec, service_create
from scheduling.states import JobState, TaskState
from tests.api.conftest import cast  # noqa: F401  (the API tests' fixed cast of users)
from tests.factories import make_cluster, make_org, make_user


@dataclass
class World:
    org: Any
    ann: Any
    bea: Any

    def create(self, **fields: Any) -> Service:
        spec = ServiceSpec(**{"name": "chat", "team": self.org.team_a, "gpu_type": "H100", "command": "serve", **fields})
        return service_create(user=self.ann, spec=spec)


@pytest.fixture
def world(db) -> World:
    org = make_org()
    make_cluster(nodes=4, leaves_per_spine=2)
    return World(org=org, ann=make_user("ann", unit=org.team_a), bea=make_user("bea", unit=org.team_c))


def tick(service: Service, *, at: datetime | None = None) -> None:
    """One controller pass and one scheduling cycle, as beat would run them."""
    reconcile(service_id=service.pk, now=at)
    run_cycle_once(now=at)


def start(job: Job, *, ready: bool = True, at: datetime | None = None) -> None:
    """What the replica's agents report: its tasks run; rank 0 answers its readiness probe."""
    now = at or timezone.now()
    job.refresh_from_db()
    assert job.state == JobState.STARTING, job.state
    for task in Task.objects.filter(job=job, attempt=job.attempt):
        Task.objects.filter(pk=task.pk).update(
            state=TaskState.RUNNING,
            started_at=now,
            service_ready=ready if task.rank == 0 else None,
            service_url=f"http://127.0.0.1:{task.master_port}" if task.rank == 0 else "",
        )
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, started_at=now)


def set_ready(job: Job, ready: bool) -> None:
    Task.objects.filter(job=job, rank=0, attempt=job.attempt).update(service_ready=ready)


def live(service: Service) -> list[Job]:
    return list(Job.objects.filter(service=service).exclude(state__in=["COMPLETED", "FAILED", "CANCELLED"]).order_by("id"))


def later(seconds: float) -> datetime:
    return timezone.now() + timedelta(seconds=seconds)
