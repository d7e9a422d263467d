"""A node's heartbeat: liveness first, then its state (DOWN, draining, disk), task starts and facts,
telemetry windows and XIDs, and the `desired` list it gets back (each entry built by desired.py)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, cast

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.models import Case, F, Field, Model, Value, When
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from scheduling import services as scheduling_services
from scheduling.agent.services.desired import gang_nodes, task_spec
from scheduling.agent.services.live_tasks import live_tasks_of
from scheduling.agent.services.reports import (
    SKEW_CORRECTED_S,
    DevReport,
    GpuSample,
    GpuWindowReport,
    Heartbeat,
    HeartbeatResult,
    ServiceReport,
    TaskReport,
    epoch,
)  # fmt: skip
from scheduling.models import (
    Gpu,
    GpuWindow,
    Job,
    Node,
    NodeState,
    Task,
    XidEvent,
)
from scheduling.serving.kick import serving_request
from scheduling.states import TaskState
from tenants.services import audit

# --------------------------------------------------------------------------- heartbeat


# The latest readings a sample carries, in the order of the VALUES rows below (Gpu's fields of the same names).
LATEST_FIELDS = ("utilization_pct", "memory_used_mb", "temperature_c", "power_w")
WINDOW_FIELDS = ("samples", "utilization_sum", "utilization_max", "memory_used_max_mb")
WINDOW_BATCH = 1000


def _column(model: type[Model], name: str) -> str:
    """The column of ``model``'s field ``name``, quoted for the database."""
    return connection.ops.quote_name(cast("Field[Any, Any]", model._meta.get_field(name)).column)


def _values(rows: Sequence[Sequence[Any]], casts: Sequence[str]) -> tuple[str, list[Any]]:
    """A VALUES list of ``rows`` and its parameters. The first row casts its columns (``casts``, "" for none):
    PostgreSQL types a column of VALUES from its rows, and a column of NULLs alone (a metric that failed on
    every GPU) would be text."""
    first = ", ".join(f"CAST(%s AS {cast})" if cast else "%s" for cast in casts)
    rest = "(" + ", ".join(["%s"] * len(casts)) + ")"
    return ", ".join([f"({first})", *[rest] * (len(rows) - 1)]), [value for row in rows for value in row]


def _store_latest(*, node: Node, samples: Sequence[GpuSample], now: datetime) -> None:
    """The latest readings on the node's Gpu rows, matched by index, in one UPDATE … FROM (VALUES …).

    Not bulk_update: its CASE WHEN per field and GPU (5 fields x 8 GPUs) was 87 % of the CPU of a beat
    that carries samples. Written for PostgreSQL and SQLite alike (a CTE, since SQLite cannot name the
    columns of a VALUES alias; UPDATE … FROM needs SQLite 3.33). Indices the node does not have match no row.
    """
    latest = {s.index: s for s in samples}  # the last sample of an index wins, should one repeat in a body
    q = connection.ops.quote_name
    table = q(Gpu._meta.db_table)
    names = ("idx", *(f"v{i}" for i in range(len(LATEST_FIELDS))))
    values, params = _values(
        [(s.index, *(getattr(s, f) for f in LATEST_FIELDS)) for s in latest.values()],
        ("", *["double precision"] * len(LATEST_FIELDS)),
    )
    sets = ", ".join(f"{_column(Gpu, f)} = v.{n}" for f, n in zip(LATEST_FIELDS, names[1:], strict=True))
    at = _column(Gpu, "telemetry_at")
    node_col, index_col = _column(Gpu, "node"), _column(Gpu, "index")
    sql = (
        f"WITH v ({', '.join(names)}) AS (VALUES {values}) "
        f"UPDATE {table} SET {sets}, {at} = %s FROM v WHERE {table}.{node_col} = %s AND {table}.{index_col} = v.idx"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, connection.ops.adapt_datetimefield_value(now), node.pk])


def _store_windows(*, node: Node, windows: Sequence[GpuWindowReport]) -> None:
    """The agent's folded minutes, in one INSERT … SELECT … ON CONFLICT DO UPDATE, the GPUs found by index in it.

    Each GPU's minute is folded by its own agent and sent whole once the minute is over (or again, if
    the answer was lost), so a repeat overwrites with the same values. Times are written as the ORM
    writes them (the backend's adapter), so that it reads and compares them as its own.
    """
    size = float(cast(float, settings.YARD["TELEMETRY_WINDOW_S"]))
    rows = {
        (w.index, w.start - w.start % size): w  # the last report of a window wins, should one repeat in a body
        for w in windows
    }
    q = connection.ops.quote_name
    window, gpu = q(GpuWindow._meta.db_table), q(Gpu._meta.db_table)
    columns = [_column(GpuWindow, f) for f in WINDOW_FIELDS]
    adapt = connection.ops.adapt_datetimefield_value
    gpu_id, start = _column(GpuWindow, "gpu"), _column(GpuWindow, "start")
    node_col, index_col = _column(Gpu, "node"), _column(Gpu, "index")
    listed = list(rows.items())
    # A backlog (an agent that could not reach the portal for hours) in statements of WINDOW_BATCH rows:
    # SQLite allows 32,766 parameters in one.
    for at in range(0, len(listed), WINDOW_BATCH):
        values, params = _values(
            [
                (index, adapt(datetime.fromtimestamp(begins, tz=UTC)), w.samples, min(w.utilization_sum, 100.0 * w.samples),
                 w.utilization_max, w.memory_used_max_mb)
                for (index, begins), w in listed[at : at + WINDOW_BATCH]
            ],
            ("", "", "", *["double precision"] * 3),
        )  # fmt: skip
        sql = (
            f"WITH v (idx, start, {', '.join(f'v{i}' for i in range(len(columns)))}) AS (VALUES {values}) "
            f"INSERT INTO {window} ({gpu_id}, {start}, {', '.join(columns)}) "
            f"SELECT g.{q(Gpu._meta.pk.column)}, v.start, {', '.join(f'v.v{i}' for i in range(len(columns)))} FROM v, {gpu} g "
            # A WHERE, not JOIN … ON: SQLite would read the ON of ON CONFLICT as the join's.
            f"WHERE g.{node_col} = %s AND g.{index_col} = v.idx "
            f"ON CONFLICT ({gpu_id}, {start}) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in columns)}"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, [*params, node.pk])


def _store_telemetry(*, node: Node, heartbeat: Heartbeat, now: datetime) -> list[tuple[Gpu, int]]:
    """Latest values on each Gpu, the one-minute windows, XID events: a statement each, none at all in a
    heartbeat that carries no telemetry (agents send it once a minute), and no read of the GPUs but
    for XIDs (rare).

    Returns the XIDs that drain the node (settings.YARD["XID_DRAIN_CODES"]), with their GPUs.
    """
    # Matched by index, not uuid: a node seeded by the portal (the demo) knows its GPUs' places
    # before any agent has reported their uuids.
    if heartbeat.windows:
        _store_windows(node=node, windows=heartbeat.windows)
    if heartbeat.gpus:
        _store_latest(node=node, samples=heartbeat.gpus, now=now)
    # One row per GPU and code, with how often it came: a GPU spewing one XID is one row, not thousands.
    seen: dict[tuple[int, int], int] = {}
    for s in heartbeat.gpus:
        for code in s.xid_errors:
            seen[(s.index, code)] = seen.get((s.index, code), 0) + 1
    if not seen:
        return []
    gpus = {gpu.index: gpu for gpu in Gpu.objects.filter(node=node, index__in={index for index, _ in seen})}
    XidEvent.objects.bulk_create(
        XidEvent(gpu=gpus[index], time=now, code=code, count=n) for (index, code), n in seen.items() if index in gpus
    )
    drain_codes = cast(frozenset[int], settings.YARD["XID_DRAIN_CODES"])
    return [(gpus[index], code) for index, code in seen if index in gpus and code in drain_codes]


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


USE_FIELDS = ("cpu_used", "memory_used_mb", "memory_peak_mb")


def _use_moved(before: float | None, now: float) -> bool:
    """Worth a write: first reported, or moved by more than 1 % (readings jitter at every heartbeat, and a
    node's tasks are then written in the one bulk update anyway)."""
    return before is None or abs(now - before) > 0.01 * max(abs(before), abs(now), 0.01)


SERVICE_FIELDS = (
    "service_url", "service_ready", "service_restarts", "service_last_restart_at", "service_crash_looping", "service_message",
)  # fmt: skip


def _store_service_facts(task: Task, report: ServiceReport) -> bool:
    """A service replica's facts from its agent's report; True if any changed (and the task needs a write)."""
    facts = (
        (report.url or task.service_url)[:300],
        report.ready,
        report.restarts,
        epoch(report.last_restart_at) or task.service_last_restart_at,
        report.crash_looping,
        (report.message or "")[:1000],
    )
    if facts == tuple(getattr(task, name) for name in SERVICE_FIELDS):
        return False
    for name, value in zip(SERVICE_FIELDS, facts, strict=True):
        setattr(task, name, value)
    return True


DEV_FIELDS = ("dev_endpoint", "dev_login", "dev_host_key", "dev_connections", "dev_last_activity")


def _store_dev_facts(task: Task, report: DevReport) -> bool:
    """A dev session's sshd facts from its agent's report; True if any changed."""
    facts = (
        (report.endpoint or task.dev_endpoint)[:300],
        (report.login or task.dev_login)[:64],
        (report.host_key or task.dev_host_key)[:1000],
        report.connections,
        epoch(report.last_activity) or task.dev_last_activity,
    )
    if facts == tuple(getattr(task, name) for name in DEV_FIELDS):
        return False
    for name, value in zip(DEV_FIELDS, facts, strict=True):
        setattr(task, name, value)
    return True


def _store_task_facts(*, live: Sequence[Task], reports: Sequence[TaskReport]) -> None:
    """Checkpoint times, notebook activity and real use from the agent's view of its live tasks."""
    tasks, jobs, service_changes = _task_fact_changes(live=live, reports=reports)
    if tasks:
        notebook_fields = ["checkpoint_at", "notebook_url", "notebook_kernel_busy", "notebook_last_activity"]
        Task.objects.bulk_update(tasks, [*notebook_fields, *SERVICE_FIELDS, *DEV_FIELDS, *USE_FIELDS])
    if service_changes - {None}:
        # A replica became ready, stopped answering or restarted: the controller acts now, not at its tick.
        serving_request(service_ids=sorted(i for i in service_changes if i is not None))
    if jobs:
        # Only this field, and only forward (two ranks' agents may report in either order), in one
        # statement for all of them. The job's state belongs to the scheduling services.
        Job.objects.filter(pk__in=list(jobs)).update(
            last_checkpoint_at=Case(
                *(
                    When(
                        pk=pk,
                        then=Greatest(Coalesce("last_checkpoint_at", Value(j.last_checkpoint_at)), Value(j.last_checkpoint_at)),
                    )
                    for pk, j in jobs.items()
                ),
                default=F("last_checkpoint_at"),
            )
        )


def _task_fact_changes(
    *, live: Sequence[Task], reports: Sequence[TaskReport]
) -> tuple[list[Task], dict[int, Job], set[int | None]]:
    """The tasks whose facts the reports change (set on them), the jobs with a later checkpoint, and the
    services with a replica that changed: nothing to write when the first is empty."""
    by_key = {r.key: r for r in reports}
    tasks: list[Task] = []
    jobs: dict[int, Job] = {}
    service_changes: set[int | None] = set()
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
        if report.dev is not None and _store_dev_facts(task, report.dev):
            changed = True
        if report.service is not None and _store_service_facts(task, report.service):
            changed = True
            service_changes.add(task.job.service_id)
        for name in USE_FIELDS:
            value = getattr(report, name)
            if value is not None and _use_moved(getattr(task, name), value):
                setattr(task, name, value)
                changed = True
        if changed:
            tasks.append(task)
    return tasks, jobs, service_changes


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
    if heartbeat.disk_problem and state == NodeState.READY:
        # Like a kubelet's DiskPressure: no new work until the agent says there is room again.
        state, reason = NodeState.DRAINING, f"{DISK_FULL}{heartbeat.disk_problem}"[:255]
    elif not heartbeat.disk_problem and state == NodeState.DRAINING and reason.startswith(DISK_FULL) and not node.hold_reason:
        state, reason = NodeState.READY, "its disk has room again"
    return state, reason


DISK_FULL = "disk full: "  # the reason of a node the portal drained for its disk (and returns by itself)


def _settle_never_started(*, live: Sequence[Task], reports: Sequence[TaskReport], now: datetime) -> list[Task]:
    """End the ranks told to stop before their agent ever started them; the rest stay live.

    The heartbeat's task list is the agent's complete local view, and an agent ignores "stop" for a
    task it never started (docs/agent-api.md), so nobody would ever report such a rank: without this
    it would hold its GPUs forever. A rank the agent did start is in the list, and ends by its report.
    """
    ended = _never_started(live=live, reports=reports)
    for task in ended:
        scheduling_services.task_mark_exited(task=task, exit_code=None, signal=None, stopped_by="", ended_at=now)
    return [task for task in live if task not in ended] if ended else list(live)


def _never_started(*, live: Sequence[Task], reports: Sequence[TaskReport]) -> list[Task]:
    reported = {r.key for r in reports}
    return [t for t in live if t.state == TaskState.STOPPING and t.started_at is None and (t.pk, t.attempt) not in reported]


@transaction.atomic
def node_heartbeat(*, node: Node, heartbeat: Heartbeat, now: datetime | None = None) -> HeartbeatResult:
    """Record a heartbeat of ``node``: liveness, what changed of its tasks, telemetry. Returns the `desired` list."""
    now = now or timezone.now()
    # Liveness first, as the transaction's first statement: it takes the node's row lock, so a
    # concurrent liveness check cannot declare the node DOWN under this heartbeat; and SQLite
    # (`make run`) takes its write lock before any read, while waiting for it is still allowed.
    Node.objects.filter(pk=node.pk).update(last_heartbeat=now)
    return _heartbeat(node=node, heartbeat=heartbeat, now=now)


_NODE_COLUMNS = [f for f in Node._meta.concrete_fields]
_NODE_NAMES = [f.attname for f in _NODE_COLUMNS]
_NODE_STATEMENT = threading.local()


def _node_statement() -> tuple[str, list[tuple[int, list[Any], Any]]]:
    """The liveness UPDATE … RETURNING of node_heartbeat_by_token, and the backend's converters of its
    columns (SQLite returns datetimes as text; PostgreSQL needs none), made once per thread and connection."""
    db = connections[DEFAULT_DB_ALIAS]
    state = getattr(_NODE_STATEMENT, "state", None)
    if state is None or state[0] is not db:
        q = db.ops.quote_name
        columns = ", ".join(q(f.column) for f in _NODE_COLUMNS)
        last, token = q(Node._meta.get_field("last_heartbeat").column), q(Node._meta.get_field("token_hash").column)
        sql = f"UPDATE {q(Node._meta.db_table)} SET {last} = %s WHERE {token} = %s RETURNING {columns}"
        converters = []
        for i, f in enumerate(_NODE_COLUMNS):
            col = f.get_col(Node._meta.db_table)
            convs = db.ops.get_db_converters(col) + f.get_db_converters(db)  # type: ignore[attr-defined]
            if convs:
                converters.append((i, convs, col))
        state = _NODE_STATEMENT.state = (db, sql, converters)
    return state[1], state[2]


def node_heartbeat_by_token(*, token_hash: str, heartbeat: Heartbeat, now: datetime | None = None) -> HeartbeatResult | None:
    """The heartbeat of the node whose token hashes to ``token_hash``, or None for no such node.

    The node's lookup and its liveness are one statement (UPDATE … RETURNING): it finds the node by its
    token, takes its row lock (see node_heartbeat) and reads its current state, in one round trip
    instead of three on the path every node calls every few seconds.

    A quiet heartbeat (no telemetry, and nothing it reports changes anything: ``_quiet``, the same
    decisions ``_heartbeat`` takes) is those two statements and no transaction: the liveness UPDATE
    commits by itself, then the live tasks are read. BEGIN and COMMIT were two more round trips, about 8 %
    of the beat's CPU, on the call every node makes every few seconds, and they guarded only writes,
    which a quiet beat has none of. What it gives up: its read of the tasks no longer holds the node's
    row lock, so a change to the node committed between the two statements (an admin's drain, which
    locks the row) shows in its task list while its node_state is from just before; the agent's next
    beat sees both. Anything else is decided and written as before: in one transaction whose first
    statement is the liveness UPDATE, which reads the node and its tasks anew (and writes the same
    time again).
    """
    now = now or timezone.now()
    if not (heartbeat.gpus or heartbeat.windows):  # telemetry is always written
        node = _liveness(token_hash=token_hash, now=now)
        if node is None:
            return None
        live = live_tasks_of(node=node)
        if _quiet(node=node, live=live, heartbeat=heartbeat):
            node.last_heartbeat = now
            return _result(node=node, live=live)
    return _node_heartbeat_by_token(token_hash=token_hash, heartbeat=heartbeat, now=now)


@transaction.atomic
def _node_heartbeat_by_token(*, token_hash: str, heartbeat: Heartbeat, now: datetime) -> HeartbeatResult | None:
    node = _liveness(token_hash=token_hash, now=now)
    if node is None:
        return None
    return _heartbeat(node=node, heartbeat=heartbeat, now=now)


def _quiet(*, node: Node, live: Sequence[Task], heartbeat: Heartbeat) -> bool:
    """Whether ``_heartbeat`` would write nothing for this heartbeat: asked of the same functions it decides
    with (tests/agent_api/test_quiet_heartbeat.py holds the two together, change by change). Facts it
    finds changed are set on ``live``'s tasks; those are then thrown away, and the transaction reads anew."""
    reports = heartbeat.tasks
    return not (
        heartbeat.gpus
        or heartbeat.windows
        or (heartbeat.draining_reason and not node.hold_reason)
        or _next_state(node=node, live=live, heartbeat=heartbeat)[0] != node.state
        or _node_health_changes(node=node, heartbeat=heartbeat)
        or _never_started(live=live, reports=reports)
        or _started_reports(live, reports)
        or _task_fact_changes(live=live, reports=reports)[0]
    )


def _liveness(*, token_hash: str, now: datetime) -> Node | None:
    """The liveness UPDATE … RETURNING of the node whose token hashes to ``token_hash``: the node, or None."""
    sql, converters = _node_statement()
    with connection.cursor() as cursor:
        cursor.execute(sql, [now, token_hash])
        row = cursor.fetchone()
    if row is None:
        return None
    values = list(row)
    for i, convs, col in converters:
        for convert in convs:
            values[i] = convert(values[i], col, connection)
    return Node.from_db(connection.alias, _NODE_NAMES, values)


def _heartbeat(*, node: Node, heartbeat: Heartbeat, now: datetime) -> HeartbeatResult:
    """After the liveness update: the node's state, its tasks' changes, telemetry, the `desired` list.

    In the steady state (nothing changed, no telemetry due) that is one more statement (the live
    tasks); every write below happens only when something changed.
    """
    live = live_tasks_of(node=node)
    state, reason = _next_state(node=node, live=live, heartbeat=heartbeat)
    if state != node.state:
        # Conditional on the state we decided from: if it changed since (an admin, the liveness
        # check), that change stands and the next heartbeat decides again.
        changed = Node.objects.filter(pk=node.pk, state=node.state).update(state=state, state_reason=reason, state_changed_at=now)
        if changed:
            # Every state change an agent causes is audited (they are rare: only on change).
            audit(
                actor=None,
                actor_label=f"agent {node.name}",
                action="node.state",
                obj=node,
                message=f"{node.state} → {state}: {reason}",
            )
            node.state, node.state_reason = state, reason
            if state == NodeState.READY:
                scheduling_services.cycle_request()  # new capacity: place what waits now, not at the next beat
        else:
            node.refresh_from_db(fields=["state", "state_reason"])
    if heartbeat.draining_reason and not node.hold_reason:
        # The agent could not kill a task: a person must look at the node before it takes work again.
        node.hold_reason = heartbeat.draining_reason[:255]
        Node.objects.filter(pk=node.pk).update(hold_reason=node.hold_reason)
        audit(actor=None, actor_label=f"agent {node.name}", action="node.drain", obj=node, message=node.hold_reason)
    _store_node_health(node=node, heartbeat=heartbeat)
    node.last_heartbeat = now
    live = _settle_never_started(live=live, reports=heartbeat.tasks, now=now)
    scheduling_services.tasks_mark_started(tasks=live, reports=_started_reports(live, heartbeat.tasks), now=now)
    critical = _store_telemetry(node=node, heartbeat=heartbeat, now=now)
    if critical:
        _drain_for_xids(node=node, critical=critical, now=now)
    _store_task_facts(live=live, reports=heartbeat.tasks)
    return _result(node=node, live=live)


def _result(*, node: Node, live: list[Task]) -> HeartbeatResult:
    gangs = gang_nodes(live)
    return HeartbeatResult(
        node_state=node.state, live_tasks=live, desired=[task_spec(task, gangs.get((task.job_id, task.attempt))) for task in live]
    )


def _store_node_health(*, node: Node, heartbeat: Heartbeat) -> None:
    """The agent's disk problem, its container runtime and the measured skew of its clock, written only
    when they change."""
    changes = _node_health_changes(node=node, heartbeat=heartbeat)
    if changes:
        Node.objects.filter(pk=node.pk).update(**changes)
        for name, value in changes.items():
            setattr(node, name, value)


def _node_health_changes(*, node: Node, heartbeat: Heartbeat) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    disk = (heartbeat.disk_problem or "")[:255]
    if disk != node.disk_problem:
        changes["disk_problem"] = disk
    if heartbeat.container_runtime is not None and heartbeat.container_runtime != node.container_runtime:
        changes["container_runtime"] = heartbeat.container_runtime
    note = heartbeat.container_runtime_note
    if note is not None and note[:255] != node.container_runtime_note:
        changes["container_runtime_note"] = note[:255]
    skew = heartbeat.clock_skew_s
    if skew is not None and (node.clock_skew_s is None or abs(skew - node.clock_skew_s) >= SKEW_CORRECTED_S / 2):
        changes["clock_skew_s"] = round(skew, 3)
    return changes


def _started_reports(live: Sequence[Task], reports: Sequence[TaskReport]) -> dict[int, scheduling_services.StartReport]:
    """Tasks still ASSIGNED here that the agent reports started (running, stopping, or already exited)."""
    assigned = {(t.pk, t.attempt) for t in live if t.state == TaskState.ASSIGNED}
    return {
        r.task_id: scheduling_services.StartReport(
            pid=r.pid, started_at=epoch(r.started_at), notebook_url=(r.notebook.url or "") if r.notebook else ""
        )
        for r in reports
        if r.key in assigned and r.started_at is not None
    }
