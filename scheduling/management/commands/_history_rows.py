"""The rows of the demo's month of history (``demo_history``): the first-fit packer that keeps every GPU
in one allocation at a time, each job's rows (Job, Tasks, Allocations, JobEvents) with its GpuWindow
telemetry, and their bulk write.

Apart from ``demo_history`` (which decides who runs what and when: the teams' profiles, the arrivals,
the notebooks) because these are the rows the live system would have written for any such job. A
module whose name starts with "_" is no management command (Django skips it).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from scheduling.models import Allocation, GpuWindow, Job, JobEvent, JobKind, Node, Task
from scheduling.states import JobState, TaskState
from tenants.models import OrgUnit


@dataclass
class _Slot:
    """One node's GPUs: when each becomes free."""

    node: Node
    gpu_ids: list[int]
    free_at: list[datetime]


@dataclass
class _Rows:
    jobs: list[Job] = field(default_factory=list)
    tasks: list[tuple[int, Task]] = field(default_factory=list)  # (job index, task)
    allocations: list[tuple[int, int, Allocation]] = field(default_factory=list)  # (job index, task index, row)
    events: list[tuple[int, JobEvent]] = field(default_factory=list)
    windows: list[GpuWindow] = field(default_factory=list)


class _Packer:
    """First fit in time and place over the demo's nodes of one GPU type: no GPU is in two allocations."""

    def __init__(self, nodes: list[Node], gpus: dict[int, list[int]], start: datetime) -> None:
        self.slots = [_Slot(n, gpus[n.pk], [start] * len(gpus[n.pk])) for n in nodes]

    def place(
        self, replicas: int, per: int, arrival: datetime, hours: float
    ) -> tuple[datetime, list[tuple[_Slot, list[int]]]] | None:
        candidates = sorted({arrival, *(t for s in self.slots for t in s.free_at if t > arrival)})[:400]
        for t in candidates:
            chosen: list[tuple[_Slot, list[int]]] = []
            for slot in self.slots:
                free = [i for i, at in enumerate(slot.free_at) if at <= t]
                if len(free) >= per:
                    chosen.append((slot, free[:per]))
                    if len(chosen) == replicas:
                        break
            if len(chosen) == replicas:
                end = t + timedelta(hours=hours)
                for slot, positions in chosen:
                    for p in positions:
                        slot.free_at[p] = end
                return t, chosen
        return None


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _job(
    rows: _Rows,
    rng: random.Random,
    *,
    team: OrgUnit,
    user: Any,
    name: str,
    gpu_type: str,
    replicas: int,
    per: int,
    arrival: datetime,
    began: datetime,
    end: datetime,
    chosen: list[tuple[_Slot, list[int]]],
    state: str,
    borrowed: bool,
    util: float,
    preempted: bool,
    time_limit_s: int,
    kind: str = JobKind.BATCH,
    stop_reason: str = "",
) -> None:
    index = len(rows.jobs)
    attempts = [(1, began, end)]
    if preempted:
        cut = began + (end - began) * rng.uniform(0.3, 0.7)
        attempts = [(1, began, cut), (2, cut + timedelta(minutes=2), end)]
    checkpoint = attempts[0][1] + (attempts[0][2] - attempts[0][1]) * 0.8 if preempted else None
    job = Job(
        name=name,
        team=team,
        user=user,
        kind=kind,
        tier=2,
        replicas=replicas,
        gpus_per_replica=per,
        gpu_type=gpu_type,
        command="torchrun --nproc-per-node 8 train.py" if kind == JobKind.BATCH else "",
        time_limit_s=time_limit_s,
        state=state,
        attempt=len(attempts),
        submitted_at=arrival,
        started_at=attempts[-1][1],
        ended_at=end,
        state_changed_at=end,
        exit_code=0 if state == JobState.COMPLETED else 1 if state == JobState.FAILED else None,
        checkpoint_dir=f"/checkpoints/{team.slug}/history-{index}",
        borrowed=borrowed,
        last_checkpoint_at=checkpoint,
        stop_reason=stop_reason or ("CANCELLED" if state == JobState.CANCELLED else ""),
        pending_reason="",
    )
    rows.jobs.append(job)
    ev = rows.events
    ev.append(
        (index, JobEvent(time=arrival, attempt=1, to_state=JobState.PENDING, reason="submitted", actor_label=user.get_username()))
    )
    for number, a_start, a_end in attempts:
        ev.append(
            (
                index,
                JobEvent(
                    time=a_start,
                    attempt=number,
                    from_state=JobState.PENDING,
                    to_state=JobState.STARTING,
                    reason=f"placed on {len(chosen)} node(s)",
                    actor_label="scheduler",
                ),
            )
        )
        ev.append(
            (
                index,
                JobEvent(
                    time=a_start + timedelta(seconds=20),
                    attempt=number,
                    from_state=JobState.STARTING,
                    to_state=JobState.RUNNING,
                    reason="every rank running",
                    actor_label="scheduler",
                ),
            )
        )
        last = number == len(attempts)
        for rank, (slot, positions) in enumerate(chosen):
            task = Task(
                attempt=number,
                rank=rank,
                node=slot.node,
                state=TaskState.EXITED,
                started_at=a_start,
                ended_at=a_end,
                exit_code=job.exit_code if last else None,
                gpu_indices=positions,
                checkpoint_at=checkpoint if number == 1 and preempted else None,
            )
            rows.tasks.append((index, task))
            for p in positions:
                gpu_id = slot.gpu_ids[p]
                rows.allocations.append(
                    (
                        index,
                        len(rows.tasks) - 1,
                        Allocation(gpu_id=gpu_id, attempt=number, allocated_at=a_start, released_at=a_end, borrowed=borrowed),
                    )
                )
                _telemetry(rows, rng, gpu_id, a_start, a_end, util)
        if not last:
            ev.append(
                (
                    index,
                    JobEvent(
                        time=a_end,
                        attempt=number,
                        from_state=JobState.PREEMPTING,
                        to_state=JobState.PREEMPTED,
                        reason="reclaimed for a team within its guarantee",
                        actor_label="scheduler",
                    ),
                )
            )
            ev.append(
                (
                    index,
                    JobEvent(
                        time=a_end,
                        attempt=number + 1,
                        from_state=JobState.PREEMPTED,
                        to_state=JobState.PENDING,
                        reason="requeued from its checkpoint",
                        actor_label="scheduler",
                    ),
                )
            )
    ev.append(
        (
            index,
            JobEvent(
                time=end,
                attempt=len(attempts),
                from_state=JobState.RUNNING,
                to_state=state,
                reason={"COMPLETED": "every rank exited 0", "FAILED": "rank 0 exited 1"}.get(
                    state, stop_reason or "cancelled by its owner"
                ),
                actor_label="scheduler" if state != JobState.CANCELLED else user.get_username(),
            ),
        )
    )


def _telemetry(
    rows: _Rows, rng: random.Random, gpu_id: int, start: datetime, end: datetime, util: float, *, idle_tail: int = 0
) -> None:
    """A few one-minute windows spread over the allocation (and, for a reaped notebook, its idle end)."""
    minutes = int((end - start).total_seconds() // 60)
    if minutes < 2:
        return
    picks = sorted({1 + int(minutes * f) for f in (0.15, 0.5, 0.85)} - set(range(minutes - idle_tail, minutes + 1)))
    for m in picks:
        value = max(0.0, min(100.0, rng.gauss(util, 8)))
        rows.windows.append(
            GpuWindow(
                gpu_id=gpu_id,
                start=_minute(start) + timedelta(minutes=m),
                samples=6,
                utilization_sum=6 * value,
                utilization_max=min(100.0, value + 6),
                memory_used_max_mb=60000,
            )
        )
    for m in range(max(minutes - idle_tail, 1), minutes):
        rows.windows.append(
            GpuWindow(
                gpu_id=gpu_id,
                start=_minute(start) + timedelta(minutes=m),
                samples=6,
                utilization_sum=0,
                utilization_max=0,
                memory_used_max_mb=2000,
            )
        )


def _write(rows: _Rows) -> dict[str, int]:
    jobs = Job.objects.bulk_create(rows.jobs, batch_size=500)
    for index, task in rows.tasks:
        task.job_id = jobs[index].pk
    tasks = Task.objects.bulk_create([t for _, t in rows.tasks], batch_size=1000)
    allocations = []
    for index, task_index, allocation in rows.allocations:
        allocation.job_id, allocation.task_id = jobs[index].pk, tasks[task_index].pk
        allocations.append(allocation)
    Allocation.objects.bulk_create(allocations, batch_size=2000)
    events = []
    for index, event in rows.events:
        event.job_id = jobs[index].pk
        events.append(event)
    JobEvent.objects.bulk_create(events, batch_size=2000)
    GpuWindow.objects.bulk_create(rows.windows, batch_size=5000, ignore_conflicts=True)
    # A month-old job is nobody's news: the notifications collector starts past the history's events
    # (else every demo user would open the portal to a hundred unread notifications).
    from django.db.models import Max

    from notifications.models import Watermark

    last = JobEvent.objects.aggregate(m=Max("id"))["m"] or 0
    Watermark.objects.update_or_create(name="jobevent", defaults={"last_id": last})
    return {"jobs": len(jobs), "allocations": len(allocations), "events": len(events), "gpu windows": len(rows.windows)}
