"""The scheduling cycle: claim the lease, build the snapshot, call the core, apply its plan.

One cycle at a time cluster-wide, however many workers on however many hosts: the
``SchedulerLease`` row "cycle" is claimed with a conditional UPDATE that bumps its epoch
(a fencing token), on PostgreSQL and SQLite alike. Every apply transaction first re-checks
the epoch with a conditional UPDATE of the lease row, which also locks that row until the
transaction commits; a claimer's UPDATE waits for that lock. So either a write of the old
holder commits before the new holder's claim, or it is refused: a paused holder that
resumes after another took over gets none of its writes accepted.

Placements are written in bulk: a batch of gangs per transaction, a fixed number of statements
per batch (a cycle that places 4,000 one-GPU jobs writes them in about a second), each batch fenced
by the epoch. A SIGKILL mid-apply leaves whole batches only, so whole gangs only. A batch that fails
on the allocation or rendezvous-port constraint (its GPUs or port were taken meanwhile: a late write
of an older holder) is retried gang by gang, so only the gang that conflicts rolls back, whole.

On PostgreSQL the holder also takes a session-level advisory lock: when a holder dies (SIGKILL, a
lost host), its database session ends and frees the lock at once, so another worker claims the cycle
at its next tick instead of waiting for the lease to expire. A holder that is only paused keeps its
session, and the lease (renewed at every write) and its epoch fence it as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import cast

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, connection, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, QuerySet
from django.utils import timezone

from scheduling.core.eta import with_estimates
from scheduling.core.plan import plan
from scheduling.core.types import Locality, Placement, Plan, Preemption, Snapshot
from scheduling.models import Allocation, Job, JobEvent, Node, SchedulerLease, Task
from scheduling.selectors import node_name_of, snapshot_build, yard_number
from scheduling.services import StaleState, job_request_stop
from scheduling.states import ACTIVE_STATES, TASK_LIVE_STATES, JobState, TaskState
from tenants.models import AuditEntry
from tenants.services import audit

log = logging.getLogger(__name__)

LEASE_NAME = "cycle"
# pg_advisory_lock key of the cycle: any constant the deployment does not use for something else.
ADVISORY_KEY = 0x59415244  # "YARD"
# Gangs written per transaction: large enough that 4,000 placements take a few statements each,
# small enough that one transaction's locks and memory stay modest.
APPLY_BATCH = 500
CYCLE_SECONDS_CACHE_KEY = "yard:last_cycle_s"

# Test hook: seconds to sleep between gangs while applying, so a test can SIGKILL a worker mid-apply.
APPLY_PAUSE_ENV = "YARD_TEST_APPLY_PAUSE_S"

LOCALITY_WORDS = {
    Locality.NVLINK: "nvlink",
    Locality.PCIE: "pcie",
    Locality.NODE: "node",
    Locality.FABRIC: "fabric",
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
    locked: bool = False  # holds the PostgreSQL session lock too


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
    # where the time went: snapshot from the database, plan(), writing the plan
    snapshot_seconds: float = 0.0
    plan_seconds: float = 0.0
    apply_seconds: float = 0.0


def _lease_s() -> float:
    return yard_number("CYCLE_LEASE_S")


def _session_lock() -> bool:
    """Take the cycle's session-level advisory lock (PostgreSQL); True where there is no such thing."""
    if connection.vendor != "postgresql":
        return True
    with connection.cursor() as cursor:
        # Held by this very session already (another lease of this process is running): the lock is
        # re-entrant, so taking it again would prove nothing about the other holder.
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() "
            "AND classid = 0 AND objid = %s AND granted",
            [ADVISORY_KEY],
        )
        if cursor.fetchone()[0]:
            return False
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [ADVISORY_KEY])
        return bool(cursor.fetchone()[0])


def _session_unlock() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [ADVISORY_KEY])


def lease_claim(*, holder: str | None = None, now: datetime | None = None) -> Lease | None:
    """Claim the cycle lease if it is free, expired, or its holder's database session is gone; the new
    epoch fences every earlier holder."""
    now = now or timezone.now()
    holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    SchedulerLease.objects.get_or_create(name=LEASE_NAME, defaults={"expires_at": now})
    # The session lock is free when no holder's session is alive: a holder that died (SIGKILL) lost it
    # with its connection, so its lease no longer needs to run out. Without it (a live holder, maybe
    # paused), only an expired lease may be taken over.
    sole = connection.vendor == "postgresql" and _session_lock()
    try:
        with transaction.atomic():
            free = Q(expires_at__lte=now) | Q(holder="")
            claimed = (
                SchedulerLease.objects.filter(name=LEASE_NAME)
                .filter(Q(pk=LEASE_NAME) if sole else free)
                .update(holder=holder, epoch=F("epoch") + 1, expires_at=now + timedelta(seconds=_lease_s()))
            )
            epoch = SchedulerLease.objects.values_list("epoch", flat=True).get(name=LEASE_NAME) if claimed else 0
    except BaseException:
        # The claim failed (a database error, an interrupt): a session lock kept by this live connection
        # would shut every other worker out of the cycle until this process exits.
        if sole:
            with contextlib.suppress(Exception):
                _session_unlock()
        raise
    if not claimed:
        if sole:
            _session_unlock()
        return None
    return Lease(holder=holder, epoch=epoch, locked=sole)


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
    try:
        SchedulerLease.objects.filter(name=LEASE_NAME, holder=lease.holder, epoch=lease.epoch).update(
            holder="", expires_at=timezone.now()
        )
    finally:  # the lease runs out by itself; the session lock would not
        if lease.locked:
            with contextlib.suppress(Exception):
                _session_unlock()


# --------------------------------------------------------------------------- the cycle


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
        plan_ = with_estimates(snapshot, plan(snapshot, now=now.timestamp()), now=now.timestamp())
        t2 = time.monotonic()
        result = apply_plan(lease=lease, snapshot=snapshot, plan_=plan_, now=now)
        result.snapshot_seconds, result.plan_seconds, result.apply_seconds = t1 - t0, t2 - t1, time.monotonic() - t2
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
        "cycle epoch %s: placed %d, conflicts %d, preempted %d, time-limited %d, %d reasons updated in %.2f s "
        "(snapshot %.3f s, plan %.3f s, apply %.3f s)",
        result.epoch,
        len(result.placed),
        len(result.conflicts),
        len(result.preempted),
        len(result.time_limited),
        result.reasons_updated,
        result.seconds,
        result.snapshot_seconds,
        result.plan_seconds,
        result.apply_seconds,
    )
    return result


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
    return result


def master_address(node: Node) -> str:
    """Where a gang whose rank 0 runs on ``node`` meets (MASTER_ADDR): the node's address, or its name
    when it has none. Rendezvous ports are unique per such address."""
    return node.address or node.name


class _PlacementWriter:
    """Writes placements in bulk: per batch a fixed number of statements, whatever its size."""

    def __init__(self, *, snapshot: Snapshot, placements: tuple[Placement, ...], now: datetime) -> None:
        self.now = now
        self.gpu_index = {g.id: g.index for n in snapshot.topology.nodes for g in n.gpus}
        names = {name for p in placements for name in p.nodes}
        # A core node name may stand for one node's MIG instances of one type ("n1~H100.1g.10gb").
        rows = {n.name: n for n in Node.objects.select_related("leaf").filter(name__in={node_name_of(x) for x in names})}
        self.nodes = {name: rows[node_name_of(name)] for name in names if node_name_of(name) in rows}
        low, high = cast(tuple[int, int], settings.YARD["RENDEZVOUS_PORTS"])
        self.ports = range(low, high + 1)
        self.skipped: dict[int, str] = {}  # job id -> why it was not written (no free rendezvous port)

    def write(self, gangs: list[Placement] | tuple[Placement, ...]) -> list[int]:
        ids = [int(p.job_id) for p in gangs]
        # Locked in id order, as every service locks jobs; only those still PENDING (not cancelled or
        # placed by an older cycle since the snapshot).
        jobs = {j.pk: j for j in Job.objects.select_for_update().filter(pk__in=ids, state=JobState.PENDING).order_by("pk")}
        gangs = [p for p in gangs if int(p.job_id) in jobs]
        if not gangs:
            return []
        ports = self._ports(gangs, jobs)
        gangs = [p for p in gangs if int(p.job_id) in ports]
        tasks: list[Task] = []
        events: list[JobEvent] = []
        audits: list[AuditEntry] = []
        for p in gangs:
            job = jobs[int(p.job_id)]
            leaf_names = sorted({self.nodes[n].leaf.name for n in p.nodes})
            node_names = list(dict.fromkeys(p.nodes))
            locality = LOCALITY_WORDS[p.locality]
            where = f"placed on {', '.join(leaf_names)} (nodes {', '.join(node_names)}, locality {locality})"
            if p.borrowed:
                where += "; runs on borrowed quota (reclaimable)"
            events.append(
                JobEvent(
                    job=job,
                    time=self.now,
                    attempt=job.attempt,
                    from_state=JobState.PENDING,
                    to_state=JobState.STARTING,
                    reason=where,
                    actor_label="scheduler",
                )
            )
            job.state, job.state_changed_at = JobState.STARTING, self.now
            job.locality, job.leaves_spanned, job.borrowed = locality, p.leaves, p.borrowed
            job.pending_reason, job.estimated_start, job.reservation_domain = "", None, ""
            master = self.nodes[p.nodes[0]]
            for rank, (gpu_ids, node_name) in enumerate(zip(p.replicas, p.nodes, strict=True)):
                tasks.append(
                    Task(
                        job=job,
                        attempt=job.attempt,
                        rank=rank,
                        node=self.nodes[node_name],
                        state=TaskState.ASSIGNED,
                        master_addr=master_address(master),
                        master_port=ports[job.pk],
                        gpu_indices=sorted(self.gpu_index[g] for g in gpu_ids),
                        created_at=self.now,
                    )
                )
            audits.append(
                AuditEntry(
                    time=self.now,
                    actor_label="scheduler",
                    action="job.place",
                    object_type="job",
                    object_id=str(job.pk),
                    unit_id=job.team_id,
                    message=where,
                    data={
                        "attempt": job.attempt,
                        "nodes": node_names,
                        "gpus": [list(r) for r in p.replicas],
                        "port": ports[job.pk],
                    },
                )
            )
        # One UPDATE per kind of placement (what differs between gangs is their locality and borrowing;
        # the rest is the same for all), rather than a CASE over every row.
        kinds: dict[tuple[str, int, bool], list[int]] = {}
        for p in gangs:
            job = jobs[int(p.job_id)]
            kinds.setdefault((job.locality, job.leaves_spanned, job.borrowed), []).append(job.pk)
        for (locality, leaves, borrowed), ids in kinds.items():
            Job.objects.filter(pk__in=ids).update(
                state=JobState.STARTING,
                state_changed_at=self.now,
                locality=locality,
                leaves_spanned=leaves,
                borrowed=borrowed,
                pending_reason="",
                estimated_start=None,
                reservation_domain="",
            )
        JobEvent.objects.bulk_create(events)
        Task.objects.bulk_create(tasks)
        by_rank = {(t.job_id, t.rank): t for t in tasks}
        Allocation.objects.bulk_create(
            Allocation(
                gpu_id=int(g),
                task=by_rank[(int(p.job_id), rank)],
                job_id=int(p.job_id),
                attempt=jobs[int(p.job_id)].attempt,
                allocated_at=self.now,
                borrowed=p.borrowed,
            )
            for p in gangs
            for rank, gpu_ids in enumerate(p.replicas)
            for g in gpu_ids
        )
        AuditEntry.objects.bulk_create(audits)
        return [int(p.job_id) for p in gangs]

    def _ports(self, gangs: list[Placement], jobs: dict[int, Job]) -> dict[int, int]:
        """A rendezvous port per gang, free among the live gangs at its rank-0 address; the port of the
        job's previous attempt when it is still free there (a requeued job keeps its MASTER_PORT if it can).

        Per address, not per node: the rendezvous store binds every interface, so nodes that share an
        address (simulated nodes on one host, or one host registered twice) share one port space. A port
        counts as taken at an address when a live rank 0 was given it at that address, or runs on a node
        that has that address now (its address changed since it was placed)."""
        masters = {int(p.job_id): self.nodes[p.nodes[0]] for p in gangs}
        addrs = {job_id: master_address(node) for job_id, node in masters.items()}
        wanted_addrs = set(addrs.values())
        # The nodes at those addresses now, and the masters themselves (their address may have changed).
        node_addr = {n.pk: master_address(n) for n in masters.values()}
        for pk, address, name in Node.objects.filter(Q(address__in=wanted_addrs) | Q(name__in=wanted_addrs)).values_list(
            "pk", "address", "name"
        ):
            node_addr.setdefault(pk, address or name)
        taken: dict[str, set[int]] = {}
        live = Task.objects.filter(
            Q(master_addr__in=wanted_addrs) | Q(node_id__in=set(node_addr)),
            rank=0,
            state__in=TASK_LIVE_STATES,
            master_port__isnull=False,
        ).values_list("master_addr", "node_id", "master_port")
        for addr, node_id, port in live:
            if port is not None:
                taken.setdefault(addr, set()).add(port)
                if node_id in node_addr:
                    taken.setdefault(node_addr[node_id], set()).add(port)
        previous = dict(
            Task.objects.filter(job_id__in=list(masters), rank=0, master_port__isnull=False)
            .order_by("job_id", "attempt")
            .values_list("job_id", "master_port")
        )  # the last attempt's port wins (ordered by attempt)
        chosen: dict[int, int] = {}
        for job_id, addr in addrs.items():
            used = taken.setdefault(addr, set())
            wanted = previous.get(job_id)
            port = wanted if wanted is not None and wanted in self.ports and wanted not in used else None
            if port is None:
                port = next((q for q in self.ports if q not in used), None)
            if port is None:
                self.skipped[job_id] = (
                    f"waiting for a free rendezvous port at {addr} (rank-0 node {masters[job_id].name}): all of "
                    f"{self.ports.start}-{self.ports.stop - 1} are in use by live jobs there (YARD_RENDEZVOUS_PORTS)"
                )
                continue
            used.add(port)
            chosen[job_id] = port
        for job_id, why in self.skipped.items():
            Job.objects.filter(pk=job_id, state=JobState.PENDING).update(pending_reason=why)
        return chosen


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
    changed: list[Job] = []
    pending = Job.objects.filter(state=JobState.PENDING).exclude(pk__in=placed)
    for pk, reason, estimated, domain in pending.values_list("id", "pending_reason", "estimated_start", "reservation_domain"):
        key = str(pk)
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
        job = Job(pk=pk, pending_reason=reason, estimated_start=estimated, reservation_domain=domain)
        if _differs(job, wanted):
            for name, value in wanted.items():
                setattr(job, name, value)
            changed.append(job)
    updated = 0
    for at in range(0, len(changed), APPLY_BATCH):
        chunk = changed[at : at + APPLY_BATCH]
        # Only jobs still PENDING: a job placed or cancelled since keeps what it says now.
        still = set(
            Job.objects.select_for_update()
            .filter(pk__in=[j.pk for j in chunk], state=JobState.PENDING)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        # Jobs that wait for the same reason until the same moment are one UPDATE (a queue of thousands
        # holds few distinct reasons), rather than a CASE over every row.
        same: dict[tuple[str, datetime | None, str], list[int]] = {}
        for j in chunk:
            if j.pk in still:
                same.setdefault((j.pending_reason, j.estimated_start, j.reservation_domain), []).append(j.pk)
        for (reason, start, domain), ids in same.items():
            updated += Job.objects.filter(pk__in=ids).update(
                pending_reason=reason, estimated_start=start, reservation_domain=domain
            )
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
    """Order TIME_LIMIT stops for running gangs past start + time limit (their agents enforce it too).

    Only the overdue are read: the database compares start + limit with now, so a cluster of thousands of
    running jobs costs one indexed query per cycle, not a model instance each."""
    stopped: list[int] = []
    running = Job.objects.filter(state=JobState.RUNNING, stop_requested_at__isnull=True, started_at__isnull=False)
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
