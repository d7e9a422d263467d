"""Builders for the governance tests: running jobs with allocations, and simulated GPU telemetry."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from scheduling.models import Allocation, Gpu, GpuWindow, Job, JobKind, Node, Task
from scheduling.states import JobState, TaskState
from tenants.models import OrgUnit
from tests.factories import make_job

MINUTE = timedelta(minutes=1)


def running_job(
    *, team: OrgUnit, user: Any, node: Node, gpus: int = 1, start: datetime, kind: str = JobKind.BATCH, **fields: Any
) -> Job:
    """A RUNNING job of ``gpus`` GPUs on ``node`` since ``start``, with its task and live allocations."""
    job = make_job(
        team=team, user=user, kind=kind, gpus_per_replica=gpus, state=JobState.RUNNING, started_at=start,
        submitted_at=start - timedelta(minutes=5), **fields,
    )  # fmt: skip
    task = Task.objects.create(job=job, attempt=job.attempt, rank=0, node=node, state=TaskState.RUNNING, started_at=start)
    busy = Allocation.objects.filter(released_at__isnull=True).values("gpu_id")
    free = Gpu.objects.filter(node=node).exclude(pk__in=busy).order_by("index")[:gpus]
    for gpu in free:
        Allocation.objects.create(gpu=gpu, task=task, job=job, attempt=job.attempt, allocated_at=start)
    return job


def telemetry(job: Job, *, start: datetime, minutes: int, utilization: float) -> None:
    """One window per minute per GPU the job holds, every sample at ``utilization`` percent."""
    gpu_ids = Allocation.objects.filter(job=job, released_at__isnull=True).values_list("gpu_id", flat=True)
    GpuWindow.objects.bulk_create(
        GpuWindow(
            gpu_id=gpu_id, start=start + i * MINUTE, samples=6, utilization_sum=6 * utilization,
            utilization_max=utilization, memory_used_max_mb=1024,
        )
        for gpu_id in gpu_ids
        for i in range(minutes)
    )  # fmt: skip


def attempt(
    job: Job,
    *,
    node: Node,
    number: int,
    gpus: list[int],
    start: datetime,
    end: datetime | None,
    borrowed: bool = False,
    checkpoint_at: datetime | None = None,
) -> Task:
    """One attempt of ``job`` on GPUs ``gpus`` (indexes on ``node``) from ``start`` to ``end`` (None: still live)."""
    task = Task.objects.create(
        job=job, attempt=number, rank=0, node=node, started_at=start, ended_at=end, checkpoint_at=checkpoint_at,
        state=TaskState.EXITED if end else TaskState.RUNNING,
    )  # fmt: skip
    for index in gpus:
        Allocation.objects.create(
            gpu=Gpu.objects.get(node=node, index=index), task=task, job=job, attempt=number, allocated_at=start,
            released_at=end, borrowed=borrowed,
        )  # fmt: skip
    return task
