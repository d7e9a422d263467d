"""The scheduling cycle: claim the lease, build the snapshot, call the core, apply its plan.

One cycle at a time cluster-wide: the lease and its fencing are in ``cycle_lease``. Placements are
written in bulk (``cycle_placements``): a batch of gangs per transaction, a fixed number of statements
per batch (a cycle that places 4,000 one-GPU jobs writes them in about a second), each batch fenced
by the epoch. A SIGKILL mid-apply leaves whole batches only, so whole gangs only. A batch that fails
on the allocation or rendezvous-port constraint (its GPUs or port were taken meanwhile: a late write
of an older holder) is retried gang by gang, so only the gang that conflicts rolls back, whole.
Then the preemptions, the pending reasons and the time limits, each under the same fence.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Field, QuerySet
from django.utils import timezone

from scheduling.core.eta import Estimator
from scheduling.core.plan import plan
from scheduling.core.types import Plan, Preemption, Snapshot
from scheduling.cycle_lease import Lease, LeaseLost, lease_claim, lease_fence, lease_release
from scheduling.cycle_placements import _PlacementWriter
from scheduling.models import Job
from scheduling.selectors import snapshot_build
from scheduling.selectors.snapshot import Epoch, raw_rows
from scheduling.services import StaleState, job_arrays_hold_reasons, job_request_stop
from scheduling.states import ACTIVE_STATES, JobState
from tenants.services import audit

log = logging.getLogger(__name__)


# Gangs written per transaction: large enough that 4,000 placements take a few statements each,
# small enough that one transaction's locks and memory stay modest.
APPLY_BATCH = 500
CYCLE_SECONDS_CACHE_KEY = "yard:last_cycle_s"

# Test hook: seconds to sleep between gangs while applying, so a test can SIGKILL a worker mid-apply.
APPLY_PAUSE_ENV = "YARD_TEST_APPLY_PAUSE_S"


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
    # where the time went: snapshot from the database, plan(), the estimated starts, writing the plan
    snapshot_seconds: float = 0.0
    plan_seconds: float = 0.0
    estimates_seconds: float = 0.0
    apply_seconds: float = 0.0


def run_cycle_once(*, now: datetime | None = None) -> CycleResult:
    """One cycle if the lease is free: snapshot -> plan -> apply. Returns what it did."""
    started = time.monotonic()
    lease = lease_claim()
    if lease is None:
        return CycleResult(ran=False)
    try:
        now = now or timezone.now()
        t0 = time.monotonic()
        snapshot = snapshot_build(now=now)
        t1 = time.monotonic()
        # Every wait with an estimated start (quota waits included), the same figure the preview gives.
        planned = plan(snapshot, now=now.timestamp())
        t2 = time.monotonic()
        plan_ = estimates_refresh(snapshot, planned, now=now.timestamp())
        t3 = time.monotonic()
        result = apply_plan(lease=lease, snapshot=snapshot, plan_=plan_, now=now)
        result.snapshot_seconds, result.plan_seconds, result.estimates_seconds = t1 - t0, t2 - t1, t3 - t2
        result.apply_seconds = time.monotonic() - t3
        result.time_limited = enforce_time_limits(lease=lease, now=now)
    except LeaseLost:
        # This holder stalled past its lease and another took over: what it had applied stands
        # (each gang whole), the rest is the new holder's to decide from a fresh snapshot.
        log.warning("cycle epoch %s lost its lease mid-apply; its remaining writes were refused", lease.epoch)
        return CycleResult(ran=False, epoch=lease.epoch, seconds=time.monotonic() - started)
    finally:
        lease_release(lease)
    _freeze_heap_once()
    result.seconds = time.monotonic() - started
    # For /metrics (yard_scheduler_cycle_duration_seconds): any web process reads the newest one.
    try:
        cache.set(CYCLE_SECONDS_CACHE_KEY, result.seconds, None)
    except Exception:  # a cache outage must not fail a cycle that has already committed
        log.warning("could not record the cycle's duration", exc_info=True)
    log.info(
        "cycle epoch %s: placed %d, conflicts %d, preempted %d, time-limited %d, %d reasons updated in %.2f s "
        "(snapshot %.3f s, plan %.3f s, estimates %.3f s, apply %.3f s)",
        result.epoch,
        len(result.placed),
        len(result.conflicts),
        len(result.preempted),
        len(result.time_limited),
        result.reasons_updated,
        result.seconds,
        result.snapshot_seconds,
        result.plan_seconds,
        result.estimates_seconds,
        result.apply_seconds,
    )
    return result


# The estimated starts' model of the cluster, kept between the cycles of this process while the state it
# read is unchanged (``eta.Estimator``): a cycle where nothing changed does not rebuild it. Where only
# time moved on past an end (or a stop's grace period moves with it), an estimate kept for up to 30 s is
# at most 30 s early: half the minute of drift that ``_apply_reasons`` does not write anyway.
ESTIMATES_KEEP_S = 30.0
_ESTIMATES = Estimator(keep_s=ESTIMATES_KEEP_S)


# Python's collector, in the cycle's process. After the first cycle most of the objects it tracks are
# long-lived: Django and the app, the snapshot's kept running jobs, the estimates' model. Scanning them
# again at every full collection was 57 of a churn cycle's ~300 ms of CPU at 1,000 nodes (the GC column
# of bench/cycle.py); ``gc.freeze`` once, after the first cycle, leaves them out of every later collection
# (they are still freed by reference counting when dropped: only garbage in reference cycles among them
# would stay, and that is one cycle's worth, once). A cycle also allocates about a million short-lived
# objects, most freed by reference counting at once; at the default 700 allocations between youngest-
# generation collections the collector ran some 1,400 times a cycle over the same survivors. At 10,000
# it runs a fourteenth as often (GC 21 -> 11 ms of a churn cycle); a young collection still bounds the
# cyclic garbage it can leave to 10,000 objects.
GC_YOUNG_THRESHOLD = 10_000
_HEAP = {"frozen": False}


def _freeze_heap_once() -> None:
    if not _HEAP["frozen"]:
        _HEAP["frozen"] = True
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(max(GC_YOUNG_THRESHOLD, gc.get_threshold()[0]), older, oldest)


def estimates_refresh(snapshot: Snapshot, planned: Plan, *, now: float) -> Plan:
    """``planned`` with every waiting job's estimated start, the same figure the preview gives."""
    return _ESTIMATES.with_estimates(snapshot, planned, now=now)


def apply_plan(*, lease: Lease, snapshot: Snapshot, plan_: Plan, now: datetime) -> CycleResult:
    """Write the plan: placements in fenced batches, then one fenced transaction per preemption, then
    the pending reasons."""
    result = CycleResult(ran=True, epoch=lease.epoch)
    pause = float(os.environ.get(APPLY_PAUSE_ENV, "0") or 0)
    writer = _PlacementWriter(snapshot=snapshot, placements=plan_.placements, now=now)
    batch = 1 if pause else APPLY_BATCH  # the test hook pauses between gangs, so it writes one at a time
    for start in range(0, len(plan_.placements), batch):
        gangs = plan_.placements[start : start + batch]
        try:
            with transaction.atomic():
                lease_fence(lease)
                result.placed += writer.write(gangs)
        except IntegrityError:
            # A GPU or a port of the batch was taken meanwhile (a late write of an older holder, or a
            # stale snapshot): the batch rolled back whole; retry it gang by gang, so that only the gang
            # that conflicts stays PENDING (whole) for the next cycle.
            for gang in gangs:
                try:
                    with transaction.atomic():
                        lease_fence(lease)
                        result.placed += writer.write([gang])
                except IntegrityError:
                    result.conflicts.append(int(gang.job_id))
                    log.warning("placement of job %s conflicted with a live allocation or port; rolled back whole", gang.job_id)
        if pause:
            time.sleep(pause)
    for preemption in plan_.preemptions:
        with transaction.atomic():
            lease_fence(lease)
            if _apply_preemption(preemption):
                result.preempted.append(int(preemption.job_id))
    with transaction.atomic():
        lease_fence(lease)
        result.reasons_updated = _apply_reasons(plan_, placed=set(result.placed) | set(writer.skipped))
        # The tasks an array's limit kept out of the snapshot: their reason is the limit's, not the plan's.
        result.reasons_updated += job_arrays_hold_reasons()
    return result


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
    """Pending reason, estimated start and reservation of every pending job: only rows that changed,
    written in bulk (a queue of thousands changes many reasons at once when the cluster frees up)."""
    reservations = {r.job_id: r for r in plan_.reservations}
    changed: list[tuple[int, str, float | None, str]] = []
    pending = Job.objects.filter(state=JobState.PENDING).exclude(pk__in=placed)
    rows = pending.annotate(estimated=Epoch("estimated_start"))
    for pk, reason, estimated, domain in raw_rows(rows.values_list("id", "pending_reason", "estimated", "reservation_domain")):
        key = str(pk)
        if key not in plan_.pending_reasons:
            continue  # submitted after the snapshot: the next cycle speaks for it
        start_ts = plan_.estimated_start.get(key)
        reservation = reservations.get(key)
        if reservation is not None:
            start_ts = reservation.earliest_start
        wanted = (plan_.pending_reasons[key], start_ts, reservation.domain if reservation else "")
        # a minute of drift in an estimate is not worth a write per job per cycle
        if (
            wanted[0] != reason
            or wanted[2] != domain
            or (start_ts is None) != (estimated is None)
            or (start_ts is not None and estimated is not None and abs(start_ts - estimated) >= 60)
        ):
            changed.append((pk, *wanted))
    updated = 0
    for at in range(0, len(changed), APPLY_BATCH):
        chunk = changed[at : at + APPLY_BATCH]
        updated += _write_reasons(chunk)
    # Only the flags that change (the plan has one for every running job: thousands, mostly unchanged).
    now_borrowed = {str(pk) for pk in Job.objects.filter(state__in=ACTIVE_STATES, borrowed=True).values_list("pk", flat=True)}
    to_borrow = {job_id for job_id, b in plan_.borrowed.items() if b}
    lend = [int(j) for j in to_borrow - now_borrowed]
    back = [int(j) for j in now_borrowed - to_borrow if j in plan_.borrowed]
    if lend:
        updated += Job.objects.filter(pk__in=lend).update(borrowed=True)
    if back:
        updated += Job.objects.filter(pk__in=back).update(borrowed=False)
    return updated


def _write_reasons(rows: list[tuple[int, str, float | None, str]]) -> int:
    """(job, reason, estimated start, reservation domain) rows, written to the jobs still PENDING (a job
    placed or cancelled since keeps what it says now), locked first in id order.

    One UPDATE per distinct reason was some forty statements a cycle when the jobs' reservation moved
    (each reason names it), and a list of 500 ids is 500 placeholders that the driver parses for every
    statement: on PostgreSQL the ids and the values travel as four arrays (``unnest``), two statements in
    all. SQLite: an UPDATE … FROM (VALUES …) (UPDATE … FROM needs SQLite 3.33), in a CTE since SQLite
    cannot name the columns of a VALUES alias."""
    if not rows:
        return 0
    q = connection.ops.quote_name
    meta = Job._meta
    table = q(meta.db_table)
    pk, state, reason, estimated, domain = (
        q(cast("Field[Any, Any]", meta.get_field(name)).column)
        for name in ("id", "state", "pending_reason", "estimated_start", "reservation_domain")
    )
    sets = f"{reason} = v.reason, {estimated} = v.estimated, {domain} = v.domain"
    adapt = connection.ops.adapt_datetimefield_value
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                f"SELECT {pk} FROM {table} WHERE {pk} = ANY(%s::bigint[]) AND {state} = %s ORDER BY {pk} FOR UPDATE",
                [[row[0] for row in rows], JobState.PENDING.value],
            )
            still = {found for (found,) in cursor.fetchall()}
            kept = [row for row in rows if row[0] in still]
            # ``= ANY`` besides the join: the rows are found by the primary key's index whatever the
            # planner guesses of the arrays and the table (a hash join over a scan of every job, else).
            ids = [row[0] for row in kept]
            cursor.execute(
                f"UPDATE {table} SET {sets} FROM unnest(%s::bigint[], %s::text[], %s::timestamptz[], %s::text[]) "
                f"AS v (id, reason, estimated, domain) WHERE {table}.{pk} = ANY(%s::bigint[]) AND {table}.{pk} = v.id",
                [
                    ids,
                    [row[1] for row in kept],
                    [datetime.fromtimestamp(row[2], tz=UTC) if row[2] is not None else None for row in kept],
                    [row[3] for row in kept],
                    ids,
                ],
            )
            return int(cursor.rowcount)
        still = set(Job.objects.filter(pk__in=[row[0] for row in rows], state=JobState.PENDING).values_list("pk", flat=True))
        kept = [row for row in rows if row[0] in still]
        if not kept:
            return 0
        values = ", ".join(["(%s, %s, %s, %s)"] * len(kept))
        params: list[Any] = []
        for job_id, why, start_ts, where in kept:
            params += [job_id, why, adapt(datetime.fromtimestamp(start_ts, tz=UTC)) if start_ts is not None else None, where]
        cursor.execute(
            f"WITH v (id, reason, estimated, domain) AS (VALUES {values}) "
            f"UPDATE {table} SET {sets} FROM v WHERE {table}.{pk} = v.id",
            params,
        )
        cursor.execute("SELECT changes()")  # (Python's sqlite3 counts no rows for an UPDATE that begins WITH)
        return int(cursor.fetchone()[0])


def enforce_time_limits(*, lease: Lease, now: datetime) -> list[int]:
    """Order TIME_LIMIT stops for running gangs past start + time limit (their agents enforce it too).

    Only the overdue are read: the database compares start + limit with now, so a cluster of thousands of
    running jobs costs one indexed query per cycle, not a model instance each."""
    stopped: list[int] = []
    # A limit of 0 is none: a service's replicas run until the service scales down or is deleted.
    running = Job.objects.filter(
        state=JobState.RUNNING, stop_requested_at__isnull=True, started_at__isnull=False, time_limit_s__gt=0
    )
    if connection.vendor == "postgresql":
        end = ExpressionWrapper(F("started_at") + F("time_limit_s") * timedelta(seconds=1), output_field=DateTimeField())
        overdue: QuerySet[Job] = running.annotate(ends_at=end).filter(ends_at__lte=now)
    else:  # SQLite (the demo) multiplies no interval: compare in Python over flat rows
        due_ids = [
            pk
            for pk, started, limit in running.values_list("pk", "started_at", "time_limit_s")
            if started is not None and started + timedelta(seconds=limit) <= now
        ]
        overdue = running.filter(pk__in=due_ids)
    for due in overdue.only("id", "started_at", "time_limit_s", "attempt", "state", "stop_requested_at", "team_id", "name"):
        with transaction.atomic():
            lease_fence(lease)
            job = job_request_stop(job=due, reason="TIME_LIMIT", actor_label="scheduler")
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
