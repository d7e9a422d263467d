"""The scheduling cycle: claim the lease, build the snapshot, call the core, apply its plan.

One cycle at a time cluster-wide, however many workers on however many hosts: the
``SchedulerLease`` row "cycle" is claimed with a conditional UPDATE that bumps its epoch
(a fencing token), on PostgreSQL and SQLite alike. Every apply transaction first re-checks
the epoch with a conditional UPDATE of the lease row, which also locks that row until the
transaction commits; a claimer's UPDATE waits for that lock. So either a write of the old
holder commits before the new holder's claim, or it is refused: a paused holder that
resumes after another took over gets none of its writes accepted.

Each gang is applied in its own transaction (so a SIGKILL mid-apply leaves whole gangs
only): a gang whose GPUs were taken meanwhile fails on the allocation constraint and rolls
back whole.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from scheduling.core.plan import plan
from scheduling.core.types import Locality, Placement, Plan, Preemption, Snapshot
from scheduling.models import Allocation, Gpu, Job, Node, SchedulerLease, Task
from scheduling.selectors import snapshot_build, yard_number
from scheduling.services import StaleState, job_request_stop, job_transition
from scheduling.states import JobState, TaskState
from tenants.services import audit

log = logging.getLogger(__name__)

LEASE_NAME = "cycle"
MASTER_PORT = 29500
CYCLE_SECONDS_CACHE_KEY = "yard:last_cycle_s"

# Test hook: seconds to sleep between gangs while applying, so a test can SIGKILL a worker mid-apply.
APPLY_PAUSE_ENV = "YARD_TEST_APPLY_PAUSE_S"

LOCALITY_WORDS = {
    Locality.NVLINK: "nvlink",
    Locality.PCIE: "pcie",
    Locality.NODE: "node",
    Locality.LEAF: "leaf",
    Locality.SPINE: "spine",
    Locality.CLUSTER: "cluster",
}


class LeaseLost(Exception):
    """Another holder claimed the cycle lease: this holder's writes are refused."""


@dataclass(frozen=True)
class Lease:
    holder: str
    epoch: int


@dataclass
class CycleResult:
    ran: bool
    epoch: int = 0
    placed: list[int] = field(default_factory=list)
    conflicts: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    time_limited: list[int] = field(default_factory=list)
    reasons_updated: int = 0
    seconds: float = 0.0


def _lease_s() -> float:
    return yard_number("CYCLE_LEASE_S")


def lease_claim(*, holder: str | None = None, now: datetime | None = None) -> Lease | None:
    """Claim the cycle lease if it is free or expired; the new epoch fences every earlier holder."""
    now = now or timezone.now()
    holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    SchedulerLease.objects.get_or_create(name=LEASE_NAME, defaults={"expires_at": now})
    with transaction.atomic():
        claimed = (
            SchedulerLease.objects.filter(name=LEASE_NAME)
            .filter(Q(expires_at__lte=now) | Q(holder=""))
            .update(holder=holder, epoch=F("epoch") + 1, expires_at=now + timedelta(seconds=_lease_s()))
        )
        if not claimed:
            return None
        epoch = SchedulerLease.objects.values_list("epoch", flat=True).get(name=LEASE_NAME)
    return Lease(holder=holder, epoch=epoch)


def lease_fence(lease: Lease) -> None:
    """Inside an apply transaction: refuse to write unless ``lease`` still holds the epoch; extend it.

    The conditional UPDATE locks the lease row until the caller's transaction ends, so no new
    holder can claim in between this check and the writes that follow it.
    """
    ok = SchedulerLease.objects.filter(name=LEASE_NAME, holder=lease.holder, epoch=lease.epoch).update(
        expires_at=timezone.now() + timedelta(seconds=_lease_s())
    )
    if not ok:
        raise LeaseLost(f"lease epoch {lease.epoch} of {lease.holder} was taken over")


def lease_release(lease: Lease) -> None:
    SchedulerLease.objects.filter(name=LEASE_NAME, holder=lease.holder, epoch=lease.epoch).update(
        holder="", expires_at=timezone.now()
    )


# --------------------------------------------------------------------------- the cycle


def run_cycle_once(*, now: datetime | None = None) -> CycleResult:
    """One cycle if the lease is free: snapshot -> plan -> apply. Returns what it did."""
    started = time.monotonic()
    lease = lease_claim()
    if lease is None:
        return CycleResult(ran=False)
    try:
        now = now or timezone.now()
        snapshot = snapshot_build(now=now)
        result = apply_plan(lease=lease, snapshot=snapshot, plan_=plan(snapshot, now=now.timestamp()), now=now)
        result.time_limited = enforce_time_limits(lease=lease, now=now)
    except LeaseLost:
        # This holder stalled past its lease and another took over: what it had applied stands
        # (each gang whole), the rest is the new holder's to decide from a fresh snapshot.
        log.warning("cycle epoch %s lost its lease mid-apply; its remaining writes were refused", lease.epoch)
        return CycleResult(ran=False, epoch=lease.epoch, seconds=time.monotonic() - started)
    finally:
        lease_release(lease)
    result.seconds = time.monotonic() - started
    # For /metrics (yard_scheduler_cycle_duration_seconds): any web process reads the newest one.
    try:
        cache.set(CYCLE_SECONDS_CACHE_KEY, result.seconds, None)
    except Exception:  # a cache outage must not fail a cycle that has already committed
        log.warning("could not record the cycle's duration", exc_info=True)
    log.info(
        "cycle epoch %s: placed %d, conflicts %d, preempted %d, time-limited %d, %d reasons updated in %.2f s",
        result.epoch,
        len(result.placed),
        len(result.conflicts),
        len(result.preempted),
        len(result.time_limited),
        result.reasons_updated,
        result.seconds,
    )
    return result


def apply_plan(*, lease: Lease, snapshot: Snapshot, plan_: Plan, now: datetime) -> CycleResult:
    """Write the plan: one fenced transaction per gang and per preemption, then one for pending reasons."""
    result = CycleResult(ran=True, epoch=lease.epoch)
    pause = float(os.environ.get(APPLY_PAUSE_ENV, "0") or 0)
    nodes = {
        n.name: n
        for n in Node.objects.select_related("leaf").filter(name__in={name for p in plan_.placements for name in p.nodes})
    }
    for placement in plan_.placements:
        try:
            with transaction.atomic():
                lease_fence(lease)
                if _apply_placement(placement, nodes=nodes, now=now):
                    result.placed.append(int(placement.job_id))
        except IntegrityError:
            # Its GPUs were taken meanwhile (a late write of an older cycle, or a stale snapshot):
            # the whole gang rolled back; it stays PENDING for the next cycle.
            result.conflicts.append(int(placement.job_id))
            log.warning("placement of job %s conflicted with a live allocation; rolled back whole", placement.job_id)
        if pause:
            time.sleep(pause)
    for preemption in plan_.preemptions:
        with transaction.atomic():
            lease_fence(lease)
            if _apply_preemption(preemption):
                result.preempted.append(int(preemption.job_id))
    with transaction.atomic():
        lease_fence(lease)
        result.reasons_updated = _apply_reasons(plan_, placed=set(result.placed))
    return result


def _apply_placement(placement: Placement, *, nodes: dict[str, Node], now: datetime) -> bool:
    job = Job.objects.select_for_update().filter(pk=int(placement.job_id), state=JobState.PENDING).first()
    if job is None:
        return False  # cancelled (or placed by an older cycle) since the snapshot
    leaf_names = sorted({nodes[n].leaf.name for n in placement.nodes})
    node_names = list(dict.fromkeys(placement.nodes))
    locality = LOCALITY_WORDS[placement.locality]
    where = f"placed on {', '.join(leaf_names)} (nodes {', '.join(node_names)}, locality {locality})"
    if placement.borrowed:
        where += "; runs on borrowed quota (reclaimable)"
    job_transition(
        job=job,
        to=JobState.STARTING,
        reason=where,
        actor_label="scheduler",
        locality=locality,
        leaves_spanned=placement.leaves,
        borrowed=placement.borrowed,
        pending_reason="",
        estimated_start=None,
        reservation_domain="",
    )
    master = nodes[placement.nodes[0]]
    gpus = {g.pk: g for g in Gpu.objects.filter(pk__in=[int(g) for r in placement.replicas for g in r])}
    for rank, (gpu_ids, node_name) in enumerate(zip(placement.replicas, placement.nodes, strict=True)):
        task = Task.objects.create(
            job=job,
            attempt=job.attempt,
            rank=rank,
            node=nodes[node_name],
            state=TaskState.ASSIGNED,
            master_addr=master.address or master.name,
            master_port=MASTER_PORT,
            created_at=now,
        )
        Allocation.objects.bulk_create(
            Allocation(gpu=gpus[int(g)], task=task, job=job, attempt=job.attempt, allocated_at=now, borrowed=placement.borrowed)
            for g in gpu_ids
        )
    audit(
        actor=None,
        actor_label="scheduler",
        action="job.place",
        obj=job,
        unit=job.team,
        message=where,
        data={"attempt": job.attempt, "nodes": node_names, "gpus": [list(r) for r in placement.replicas]},
    )
    return True


def _apply_preemption(preemption: Preemption) -> bool:
    job = Job.objects.filter(pk=int(preemption.job_id)).first()
    if job is None or job.stop_requested_at is not None:
        return False
    try:
        job = job_request_stop(
            job=job, reason="PREEMPTED", grace_s=preemption.grace_s, actor_label="scheduler", note=preemption.reason
        )
    except StaleState:
        return False
    audit(
        actor=None,
        actor_label="scheduler",
        action="job.preempt",
        obj=job,
        unit=job.team,
        message=preemption.reason,
        data={"for_job": preemption.for_job, "grace_s": preemption.grace_s},
    )
    return True


def _apply_reasons(plan_: Plan, *, placed: set[int]) -> int:
    """Pending reason, estimated start and reservation of every pending job; only rows that changed."""
    reservations = {r.job_id: r for r in plan_.reservations}
    updated = 0
    pending = Job.objects.filter(state=JobState.PENDING).exclude(pk__in=placed)
    for job in pending.only("id", "pending_reason", "estimated_start", "reservation_domain"):
        key = str(job.pk)
        if key not in plan_.pending_reasons:
            continue  # submitted after the snapshot: the next cycle speaks for it
        start_ts = plan_.estimated_start.get(key)
        reservation = reservations.get(key)
        if reservation is not None:
            start_ts = reservation.earliest_start
        start = datetime.fromtimestamp(start_ts, tz=UTC) if start_ts is not None else None
        wanted = {
            "pending_reason": plan_.pending_reasons[key],
            "estimated_start": start,
            "reservation_domain": reservation.domain if reservation else "",
        }
        if _differs(job, wanted):
            updated += Job.objects.filter(pk=job.pk, state=JobState.PENDING).update(**wanted)
    for job_id, borrowed in plan_.borrowed.items():
        updated += Job.objects.filter(pk=int(job_id)).exclude(borrowed=borrowed).update(borrowed=borrowed)
    return updated


def _differs(job: Job, wanted: Mapping[str, object]) -> bool:
    for name, value in wanted.items():
        current = getattr(job, name)
        if name == "estimated_start" and current is not None and value is not None:
            # a minute of drift in an estimate is not worth a write per job per cycle
            if abs((current - value).total_seconds()) >= 60:
                return True
        elif current != value:
            return True
    return False


def enforce_time_limits(*, lease: Lease, now: datetime) -> list[int]:
    """Order TIME_LIMIT stops for running gangs past start + time limit (their agents enforce it too)."""
    stopped: list[int] = []
    overdue = Job.objects.filter(state=JobState.RUNNING, stop_requested_at__isnull=True, started_at__isnull=False)
    for job in overdue.only("id", "started_at", "time_limit_s", "attempt", "state", "stop_requested_at", "team_id", "name"):
        if job.started_at is None or job.started_at + timedelta(seconds=job.time_limit_s) > now:
            continue
        with transaction.atomic():
            lease_fence(lease)
            job = job_request_stop(job=job, reason="TIME_LIMIT", actor_label="scheduler")
            audit(
                actor=None,
                actor_label="scheduler",
                action="job.kill",
                obj=job,
                unit=None,
                message=f"time limit of {job.time_limit_s} s reached",
            )
            stopped.append(job.pk)
    return stopped
