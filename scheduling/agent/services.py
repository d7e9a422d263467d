"""Writes on behalf of node agents: registration, heartbeats (liveness, telemetry, task facts),
task status and logs, drain. Keyword-only and atomic, as every service.

Job and task state changes are not made here: status reports go through the scheduling services
(task_mark_running, task_mark_exited) so that the rules for settling a gang live in one place.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Prefetch
from django.utils import timezone

from scheduling import services as scheduling_services
from scheduling.models import (
    Allocation,
    EnrolmentToken,
    Gpu,
    GpuWindow,
    Job,
    Leaf,
    Node,
    NodeState,
    Spine,
    Task,
    TaskLogChunk,
    XidEvent,
)
from scheduling.states import TASK_LIVE_STATES, TaskState
from tenants.models import hash_token
from tenants.services import audit

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    gpu_type: str
    memory_mb: int
    nvlink_domain: str
    pcie_switch: str
    numa_node: int | None


@dataclass(frozen=True)
class Registration:
    name: str
    address: str
    leaf: str
    spine: str
    simulated: bool
    agent_version: str
    gpus: Sequence[GpuInfo]


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization_pct: float | None = None
    memory_used_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    xid_errors: Sequence[int] = ()


@dataclass(frozen=True)
class NotebookReport:
    url: str | None = None
    kernel_busy: bool | None = None
    last_activity: float | None = None


@dataclass(frozen=True)
class TaskReport:
    task_id: int
    attempt: int
    state: str  # "running", "stopping" or "exited": the agent's local view
    checkpoint_time: float | None = None
    notebook: NotebookReport | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.task_id, self.attempt)


@dataclass(frozen=True)
class Heartbeat:
    gpus: Sequence[GpuSample] = ()
    tasks: Sequence[TaskReport] = ()
    draining_reason: str | None = None


@dataclass(frozen=True)
class StatusReport:
    attempt: int
    state: str  # "running" | "exited"
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    stopped_by: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    notebook_url: str | None = None
    stop_cause: str | None = None  # why the agent stopped it on its own account (docs/agent-api.md)


# An agent that stops work on its own account says why; the job then ends as if the portal had
# ordered it: past its time limit it fails with TIME_LIMIT, and work stopped because the agent lost
# the portal is requeued (the node's fault, not the job's) instead of failing on exit status 143.
_AGENT_STOP_REASONS = {"time_limit": "TIME_LIMIT", "portal_unreachable": "PREEMPTED"}


@dataclass
class HeartbeatResult:
    node_state: str
    live_tasks: list[Task] = field(default_factory=list)


class NodeExists(Exception):
    """A node of that name is registered already."""


class TaskNotFound(Exception):
    """No such task on this node (another node's task is reported the same as a missing one)."""


class StaleAttempt(Exception):
    """The report is about an attempt that is not live on this node any more."""


def epoch(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=UTC)


# --------------------------------------------------------------------------- registration


def _qualified(node: str, label: str) -> str:
    # NVLink / PCIe / NUMA labels are local to a node ("nvl0"); the scheduler compares them
    # cluster-wide, so they must not collide between nodes.
    return f"{node}/{label}"


@transaction.atomic
def node_register(*, enrolment: EnrolmentToken, registration: Registration, now: datetime | None = None) -> tuple[Node, str]:
    """Create the node (and its spine and leaf if new) with its GPUs; return it with its new token.

    Raises NodeExists for a name already registered: a node token is issued once, and handing a
    second one to whoever holds an enrolment token would let them impersonate a live node.
    """
    now = now or timezone.now()
    reg = registration
    if Node.objects.filter(name=reg.name).exists():
        raise NodeExists(reg.name)
    spine, _ = Spine.objects.get_or_create(name=reg.spine)
    leaf, _ = Leaf.objects.get_or_create(name=reg.leaf, defaults={"spine": spine})
    raw = "ynd_" + secrets.token_urlsafe(30)
    node = Node.objects.create(
        name=reg.name,
        leaf=leaf,
        address=reg.address,
        gpu_type=reg.gpus[0].gpu_type if reg.gpus else "",
        # NOT_READY until its first heartbeat: registering says the agent exists, not that it runs.
        state=NodeState.NOT_READY,
        state_reason=f"registered with enrolment token {enrolment.name!r}; waiting for the first heartbeat",
        state_changed_at=now,
        last_heartbeat=now,
        simulated=reg.simulated,
        token_hash=hash_token(raw),
        agent_version=reg.agent_version,
        registered_at=now,
    )
    Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=gpu.index,
            uuid=gpu.uuid,
            gpu_type=gpu.gpu_type,
            model_name=gpu.name,
            memory_mb=gpu.memory_mb,
            nvlink_domain=_qualified(reg.name, gpu.nvlink_domain),
            pcie_switch=_qualified(reg.name, gpu.pcie_switch),
            numa_node=_qualified(reg.name, "numa?" if gpu.numa_node is None else f"numa{gpu.numa_node}"),
        )
        for gpu in reg.gpus
    )
    return node, raw


# --------------------------------------------------------------------------- heartbeat


def _window_start(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)


def _fold_windows(*, samples: list[tuple[int, GpuSample]], start: datetime) -> None:
    """Add one sample per GPU to its one-minute window, in one upsert statement for the node.

    Django's bulk_create(update_conflicts=True) can only overwrite with the new row's values; a
    window needs sums and maxima, so this is one INSERT … ON CONFLICT DO UPDATE (PostgreSQL, and
    SQLite for `make run`, which spells GREATEST as a two-argument max()).
    """
    rows = [(gpu_id, s) for gpu_id, s in samples if s.utilization_pct is not None or s.memory_used_mb is not None]
    if not rows:
        return
    greatest = "GREATEST" if connection.vendor == "postgresql" else "MAX"
    table = connection.ops.quote_name(GpuWindow._meta.db_table)
    values = ", ".join(["(%s, %s, %s, %s, %s, %s)"] * len(rows))
    params: list[Any] = []
    for gpu_id, s in rows:
        util = s.utilization_pct
        params += [gpu_id, start, 1 if util is not None else 0, util or 0.0, util or 0.0, s.memory_used_mb or 0.0]
    sql = (
        f"INSERT INTO {table} (gpu_id, start, samples, utilization_sum, utilization_max, memory_used_max_mb) "
        f"VALUES {values} ON CONFLICT (gpu_id, start) DO UPDATE SET "
        f"samples = {table}.samples + excluded.samples, "
        f"utilization_sum = {table}.utilization_sum + excluded.utilization_sum, "
        f"utilization_max = {greatest}({table}.utilization_max, excluded.utilization_max), "
        f"memory_used_max_mb = {greatest}({table}.memory_used_max_mb, excluded.memory_used_max_mb)"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _store_telemetry(*, node: Node, samples: Sequence[GpuSample], now: datetime) -> list[tuple[Gpu, int]]:
    """Latest values on each Gpu, the one-minute windows, XID events: a fixed number of statements.

    Returns the XIDs that drain the node (settings.YARD["XID_DRAIN_CODES"]), with their GPUs.
    """
    if not samples:
        return []
    gpus = {gpu.index: gpu for gpu in Gpu.objects.filter(node=node)}
    # Matched by index, not uuid: a node seeded by the portal (the demo) knows its GPUs' places
    # before any agent has reported their uuids.
    matched = [(gpus[s.index], s) for s in samples if s.index in gpus]
    for gpu, s in matched:
        gpu.utilization_pct, gpu.memory_used_mb = s.utilization_pct, s.memory_used_mb
        gpu.temperature_c, gpu.power_w, gpu.telemetry_at = s.temperature_c, s.power_w, now
    if matched:
        Gpu.objects.bulk_update(
            [gpu for gpu, _ in matched], ["utilization_pct", "memory_used_mb", "temperature_c", "power_w", "telemetry_at"]
        )
    _fold_windows(samples=[(gpu.pk, s) for gpu, s in matched], start=_window_start(now))
    xids = [XidEvent(gpu=gpu, time=now, code=code) for gpu, s in matched for code in s.xid_errors]
    if xids:
        XidEvent.objects.bulk_create(xids)
    drain_codes = cast(frozenset[int], settings.YARD["XID_DRAIN_CODES"])
    return [(event.gpu, event.code) for event in xids if event.code in drain_codes]


# What the drain reason says for each XID that drains a node (NVIDIA's XID catalogue).
XID_MEANING = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping event",
    64: "row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}


def _drain_for_xids(*, node: Node, critical: Sequence[tuple[Gpu, int]], now: datetime) -> None:
    """Take the failing GPUs out of placement and hold the node DRAINING until an admin resumes it.

    Running work is left alone: after most of these errors it dies by itself, and what survives
    finishes or is requeued by its own failure. A repeat of the same errors changes nothing.
    """
    Gpu.objects.filter(pk__in={gpu.pk for gpu, _ in critical}, healthy=True).update(healthy=False)
    seen = sorted({(gpu.index, code) for gpu, code in critical})
    what = ", ".join(f"XID {code} ({XID_MEANING.get(code, 'critical')}) on GPU {index}" for index, code in seen)
    reason = f"{what}: reset or check the GPU, then resume the node"[:255]
    Node.objects.filter(pk=node.pk, state__in=(NodeState.READY, NodeState.NOT_READY)).update(
        state=NodeState.DRAINING, state_reason=reason, state_changed_at=now
    )
    if not node.hold_reason:
        Node.objects.filter(pk=node.pk).update(hold_reason=reason)
        data: dict[str, object] = {"xids": [[index, code] for index, code in seen]}
        audit(actor=None, actor_label=f"agent {node.name}", action="node.xid_drain", obj=node, message=reason, data=data)
    node.refresh_from_db(fields=["state", "state_reason", "hold_reason"])


def _store_task_facts(*, live: Sequence[Task], reports: Sequence[TaskReport]) -> None:
    """Checkpoint times and notebook activity from the agent's view of its live tasks."""
    by_key = {r.key: r for r in reports}
    tasks: list[Task] = []
    jobs: dict[int, Job] = {}
    for task in live:
        report = by_key.get((task.pk, task.attempt))
        if report is None:
            continue
        changed = False
        checkpoint = epoch(report.checkpoint_time)
        if checkpoint is not None and checkpoint != task.checkpoint_at:
            task.checkpoint_at, changed = checkpoint, True
            job = jobs.get(task.job_id, task.job)
            if job.last_checkpoint_at is None or checkpoint > job.last_checkpoint_at:
                job.last_checkpoint_at = checkpoint
                jobs[job.pk] = job
        nb = report.notebook
        if nb is not None:
            facts = (nb.url or task.notebook_url, nb.kernel_busy, epoch(nb.last_activity) or task.notebook_last_activity)
            if facts != (task.notebook_url, task.notebook_kernel_busy, task.notebook_last_activity):
                task.notebook_url, task.notebook_kernel_busy, task.notebook_last_activity = facts
                changed = True
        if changed:
            tasks.append(task)
    if tasks:
        Task.objects.bulk_update(tasks, ["checkpoint_at", "notebook_url", "notebook_kernel_busy", "notebook_last_activity"])
    if jobs:
        # Only this field: the job's state belongs to the scheduling services' conditional updates.
        Job.objects.bulk_update(list(jobs.values()), ["last_checkpoint_at"])


def _next_state(*, node: Node, live: Sequence[Task], heartbeat: Heartbeat) -> tuple[str, str]:
    """The node's state after this heartbeat, with its reason.

    A DOWN node had its tasks marked lost and requeued. It comes back only once the agent reports no
    process outside the live list, i.e. after it has fenced the stale ones (they are absent from
    `desired`, so the agent kills them on this very heartbeat).
    """
    state, reason = node.state, node.state_reason
    if state == NodeState.DOWN:
        wanted = {(t.pk, t.attempt) for t in live}
        stale = [r for r in heartbeat.tasks if r.state in ("running", "stopping") and r.key not in wanted]
        if stale:
            return state, f"back after being down; waiting for the agent to fence {len(stale)} stale task(s)"
        state, reason = NodeState.READY, "back after being down; stale work fenced"
    elif state == NodeState.NOT_READY:
        state, reason = NodeState.READY, "heartbeats resumed"
    if state == NodeState.READY and node.hold_reason:
        state, reason = NodeState.DRAINING, f"held until an admin resumes it: {node.hold_reason}"[:255]
    if heartbeat.draining_reason and state != NodeState.DRAINING:
        state, reason = NodeState.DRAINING, heartbeat.draining_reason[:255]
    return state, reason


def _settle_never_started(*, live: Sequence[Task], reports: Sequence[TaskReport], now: datetime) -> list[Task]:
    """End the ranks told to stop before their agent ever started them; the rest stay live.

    The heartbeat's task list is the agent's complete local view, and an agent ignores "stop" for a
    task it never started (docs/agent-api.md), so nobody would ever report such a rank: without this
    it would hold its GPUs forever. A rank the agent did start is in the list, and ends by its report.
    """
    reported = {r.key for r in reports}
    keep: list[Task] = []
    for task in live:
        if task.state == TaskState.STOPPING and task.started_at is None and (task.pk, task.attempt) not in reported:
            scheduling_services.task_mark_exited(task=task, exit_code=None, signal=None, stopped_by="", ended_at=now)
        else:
            keep.append(task)
    return keep


def live_tasks_of(*, node: Node) -> list[Task]:
    """The node's live tasks with their jobs and live GPU allocations (two queries, whatever the count)."""
    return list(
        Task.objects.filter(node=node, state__in=TASK_LIVE_STATES)
        .select_related("job__user")
        .prefetch_related(
            Prefetch(
                "allocations",
                queryset=Allocation.objects.filter(released_at__isnull=True).select_related("gpu").order_by("gpu__index"),
                to_attr="live_allocations",
            )
        )
        .order_by("job_id", "rank")
    )


@transaction.atomic
def node_heartbeat(*, node: Node, heartbeat: Heartbeat, now: datetime | None = None) -> HeartbeatResult:
    """Record a heartbeat: liveness, telemetry, task facts. Returns the live tasks for `desired`."""
    now = now or timezone.now()
    # Liveness first, as the transaction's first statement: it takes the node's row lock, so a
    # concurrent liveness check cannot declare the node DOWN under this heartbeat; and SQLite
    # (`make run`) takes its write lock before any read, while waiting for it is still allowed.
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now)
    live = live_tasks_of(node=node)
    state, reason = _next_state(node=node, live=live, heartbeat=heartbeat)
    if state != node.state:
        # Conditional on the state we decided from: if it changed since (an admin, the liveness
        # check), that change stands and the next heartbeat decides again.
        changed = Node.objects.filter(pk=node.pk, state=node.state).update(state=state, state_reason=reason, state_changed_at=now)
        if changed:
            node.state, node.state_reason = state, reason
            if state == NodeState.READY:
                scheduling_services.cycle_request()  # new capacity: place what waits now, not at the next beat
        else:
            node.refresh_from_db(fields=["state", "state_reason"])
    if heartbeat.draining_reason and not node.hold_reason:
        # The agent could not kill a task: a person must look at the node before it takes work again.
        node.hold_reason = heartbeat.draining_reason[:255]
        Node.objects.filter(pk=node.pk).update(hold_reason=node.hold_reason)
    node.last_heartbeat = now
    live = _settle_never_started(live=live, reports=heartbeat.tasks, now=now)
    critical = _store_telemetry(node=node, samples=heartbeat.gpus, now=now)
    if critical:
        _drain_for_xids(node=node, critical=critical, now=now)
    _store_task_facts(live=live, reports=heartbeat.tasks)
    return HeartbeatResult(node_state=node.state, live_tasks=live)


def task_spec(task: Task) -> dict[str, object]:
    """One entry of `desired` (docs/agent-api.md): what the agent needs to run or stop the task."""
    job = task.job
    stopping = job.stop_requested_at is not None or task.state == TaskState.STOPPING
    return {
        "task_id": task.pk,
        "job_id": job.pk,
        "attempt": task.attempt,
        # The owner's portal username: an agent run with --run-as-owner runs the task as that local account.
        "user": job.user.get_username() if job.user_id else "",
        "kind": job.kind,
        # One process per replica: torchrun inside it starts the replica's local ranks.
        "rank": task.rank,
        "world_size": job.replicas,
        "node_rank": task.rank,
        "local_rank": 0,
        "master_addr": task.master_addr,
        "master_port": task.master_port,
        "gpus": [a.gpu.index for a in getattr(task, "live_allocations", [])],
        "command": job.command,
        "env": {str(k): str(v) for k, v in (job.env or {}).items()},
        "checkpoint_dir": job.checkpoint_dir or None,
        "time_limit_s": job.time_limit_s or None,
        "action": "stop" if stopping else "run",
        "grace_s": job.stop_grace_s if job.stop_requested_at else settings.YARD["GRACE_PERIOD_S"],
        "stop_reason": (job.stop_reason or "stop requested") if stopping else None,
    }


# --------------------------------------------------------------------------- task status, logs, drain


def _task_of(*, node: Node, task_id: int, lock: bool) -> Task:
    qs = Task.objects.select_related("job").filter(pk=task_id, node=node)
    if lock:
        qs = qs.select_for_update(of=("self",))
    task = qs.first()
    if task is None:
        raise TaskNotFound(task_id)
    return task


@transaction.atomic
def task_report_status(*, node: Node, task_id: int, report: StatusReport) -> Task:
    """Apply a `running` or `exited` report through the scheduling services.

    At-least-once: a repeated report of what the portal already knows is accepted and changes
    nothing. A report about another attempt, or about a task no longer live here (lost with its
    node, or ended), raises StaleAttempt so the agent kills and forgets the process.
    """
    task = _task_of(node=node, task_id=task_id, lock=True)
    if report.attempt != task.attempt:
        raise StaleAttempt(task_id)
    if report.state == "running":
        if task.state == TaskState.ASSIGNED:
            return scheduling_services.task_mark_running(
                task=task,
                pid=report.pid,
                started_at=epoch(report.started_at) or timezone.now(),
                notebook_url=report.notebook_url or "",
            )
        if task.state in (TaskState.RUNNING, TaskState.STOPPING):
            return task  # a repeat, or the start report of a task already told to stop
        raise StaleAttempt(task_id)
    if task.state == TaskState.EXITED:
        return task  # a repeated exit report
    if task.state not in TASK_LIVE_STATES:
        raise StaleAttempt(task_id)
    stop_reason = _AGENT_STOP_REASONS.get(report.stop_cause or "")
    if stop_reason is not None and task.job.stop_requested_at is None:
        note = "the agent stopped it past its time limit" if stop_reason == "TIME_LIMIT" else "its agent lost the portal"
        scheduling_services.job_request_stop(job=task.job, reason=stop_reason, actor_label=f"agent {node.name}", note=note)
        task.refresh_from_db()
    return scheduling_services.task_mark_exited(
        task=task,
        exit_code=report.exit_code,
        signal=report.signal,
        stopped_by=report.stopped_by or "",
        ended_at=epoch(report.ended_at) or timezone.now(),
    )


@transaction.atomic
def task_log_append(*, node: Node, task_id: int, attempt: int, offset: int, data: str) -> int:
    """Store the part of a log chunk beyond what is stored already; return the stored length.

    Offsets count UTF-8 bytes of the agent's stream. The task row is locked so two deliveries of
    the same chunk cannot both append. A chunk past the stored end (one was lost) is stored where
    it belongs: a hole in a log is better than refusing the rest of it.
    """
    task = _task_of(node=node, task_id=task_id, lock=True)
    if attempt != task.attempt or task.state == TaskState.LOST:
        raise StaleAttempt(task_id)
    raw = data.encode("utf-8")
    stored = task.log_size
    skip = max(0, stored - offset)
    if skip >= len(raw):
        return stored
    tail = raw[skip:]
    start = offset + skip
    # PostgreSQL text cannot hold NUL; the byte count stays the agent's so offsets keep lining up.
    text = tail.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    TaskLogChunk.objects.create(task=task, offset=start, data=text)
    new_size = start + len(tail)
    Task.objects.filter(pk=task.pk).update(log_size=new_size)
    return new_size


@transaction.atomic
def node_drain(*, node: Node, reason: str, now: datetime | None = None) -> str:
    """Take the node out of placement until an admin resumes it (scheduling.services.node_resume).

    A DOWN node stays DOWN until it is back, and then comes back DRAINING."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).exclude(state__in=(NodeState.DRAINING, NodeState.DOWN)).update(
        state=NodeState.DRAINING, state_reason=reason[:255], state_changed_at=now
    )
    Node.objects.filter(pk=node.pk, hold_reason="").update(hold_reason=reason[:255])
    node.refresh_from_db(fields=["state", "state_reason", "hold_reason"])
    return node.state
