"""``snapshot_build``: the one place that turns database rows into the scheduler core's plain snapshot
(topology, running gangs, pending jobs, the quota tree with decayed usage, the config).

The running and pending jobs are read here, as flat rows (this runs at every cycle over thousands of
jobs); the topology and the quota tree come from ``topology`` and ``quotas``, which other reads use alone.
"""

from __future__ import annotations

from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple, cast

from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, FloatField, Func, Q, QuerySet
from django.db.models.functions import Coalesce

from scheduling.core.types import NO_CAPABILITIES, WITH_CONTAINERS, LeafLocality, PendingJob, RunningJob, Snapshot, Tier
from scheduling.models import Allocation, Job, Task
from scheduling.selectors.arrays import pending_placeable
from scheduling.selectors.config import scheduler_config
from scheduling.selectors.quotas import _quotas, refresh_unit_keys, unit_key, unit_keys_now
from scheduling.selectors.topology import topology_cached
from scheduling.states import ACTIVE_STATES


class Epoch(Func):
    """A datetime column as seconds since the Unix epoch, computed by the database: the snapshot reads
    three per running job, and parsing them as datetimes was half its time at 8,000 running jobs."""

    output_field = FloatField()
    template = "EXTRACT(EPOCH FROM %(expressions)s)::float8"

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        # Django keeps SQLite datetimes as UTC text, "YYYY-MM-DD HH:MM:SS[.ffffff]": whole seconds from
        # strftime, the fraction from the text (julianday would round to milliseconds).
        template = "(CAST(strftime('%%%%s', %(expressions)s) AS REAL) + CAST(substr(%(expressions)s, 20) AS REAL))"
        return self.as_sql(compiler, connection, template=template, **extra)


def raw_rows(query: QuerySet[Any]) -> list[tuple[Any, ...]]:
    """A values_list query's rows as the driver gives them: Django's converters ran per row and per
    annotated column (a float() of each epoch) and were a third of the snapshot at 8,000 running jobs;
    every column read here is already of its Python type."""
    sql, params = query.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    return rows


_TIERS = {int(t): t for t in Tier}
_LOCALITIES = {str(loc): loc for loc in LeafLocality}


class _Read(NamedTuple):
    """The running jobs of one snapshot: its rows, the unit names they were read with, each job by id."""

    rows: list[tuple[Any, ...]]
    slugs: dict[int, str]
    row_set: set[tuple[Any, ...]]
    by_id: dict[int, RunningJob]
    out: tuple[RunningJob, ...]


# The last snapshot's (one, replaced whole, never changed: a preview may build a snapshot in another
# thread). A cycle where no row changed returns the same tuple (the core's caches compare it by
# identity); a job whose row has not changed is the same RunningJob object as before (a frozen dataclass
# of 14 fields costs microseconds to build, and the core compares jobs cheaply when they are the same).
_LAST_RUNNING: list[_Read] = []


def _running(now: datetime) -> tuple[RunningJob, ...]:
    """Every gang holding GPUs, one row per job with its GPUs (``_running_rows``). Rows are compared with
    the last snapshot's as wholes, in C: equal lists return the last tuple, and otherwise only the rows
    that changed (a set difference) are read in Python. Reading 8,000 rows one by one, every cycle, was
    most of the snapshot (40 ms at 8,000 running jobs) when 16 of them had changed."""
    rows = _running_rows()
    slugs = unit_keys_now()  # (after ``refresh_unit_keys``: snapshot_build calls it first)
    last = _LAST_RUNNING[0] if _LAST_RUNNING else None
    if last is not None and last.slugs == slugs and last.rows == rows:
        return last.out
    row_set = set(rows)
    if last is None or last.slugs != slugs:
        by_id: dict[int, RunningJob] = {}
        came = row_set
    else:
        by_id = dict(last.by_id)
        for row in last.row_set - row_set:
            del by_id[row[0]]
        came = row_set - last.row_set
    for row in came:
        by_id[row[0]] = _running_job(row)
    out = tuple(map(by_id.__getitem__, map(_ID, rows)))
    _LAST_RUNNING[:] = [_Read(rows, slugs, row_set, by_id, out)]
    return out


_ID = itemgetter(0)


def _running_job(row: tuple[Any, ...]) -> RunningJob:
    job_id, team_id, tier, gpu_type, start, limit_s, checkpoint, priority, submitted, terminating, cpus, memory, name, gpus = row
    return RunningJob(
        job_id=str(job_id),
        team=unit_key(team_id),
        tier=_TIERS[tier],
        gpu_type=gpu_type,
        replicas=tuple(tuple(replica.split(",")) for replica in gpus.split("|")),
        start=start,
        time_limit=time_limit_of(limit_s),
        last_checkpoint=checkpoint,
        priority=priority,
        submit_time=submitted,
        terminating=bool(terminating),
        cpus_per_replica=cpus,
        memory_mb_per_replica=memory,
        name=name,
    )


def _running_rows() -> list[tuple[Any, ...]]:
    """Each active job that holds GPUs, by id: its fields and its GPUs as text, "1,2|3,4" (ranks in order,
    each rank's GPUs by id). Every live allocation belongs to an active job (one of an inactive job is an
    invariant violation, reported elsewhere, and left out here)."""
    jobs = (
        Job.objects.filter(state__in=ACTIVE_STATES)
        .annotate(
            start=Epoch(Coalesce("started_at", "state_changed_at")),
            checkpoint=Epoch("last_checkpoint_at"),
            submitted=Epoch("submitted_at"),
            terminating=ExpressionWrapper(Q(stop_requested_at__isnull=False), output_field=BooleanField()),
        )
        .values_list(*_RUNNING_FIELDS)
    )
    if connection.vendor == "postgresql":
        # The GPUs grouped by rank and job in the database (C), one row per job.
        sql, params = jobs.query.sql_with_params()
        q = connection.ops.quote_name
        allocation, task = q(Allocation._meta.db_table), q(Task._meta.db_table)
        columns = ", ".join(f"j.{q(c)}" for c in _RUNNING_FIELDS)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {columns}, r.gpus FROM ({sql}) j JOIN ("
                "SELECT job_id, string_agg(g, '|' ORDER BY rank) AS gpus FROM ("
                "SELECT a.job_id, t.rank, string_agg(a.gpu_id::text, ',' ORDER BY a.gpu_id) AS g "
                f"FROM {allocation} a JOIN {task} t ON t.id = a.task_id WHERE a.released_at IS NULL "
                "GROUP BY a.job_id, t.rank) x GROUP BY job_id) r ON r.job_id = j.id ORDER BY j.id",
                params,
            )
            return cast(list[tuple[Any, ...]], cursor.fetchall())
    by_job = {row[0]: row for row in raw_rows(jobs)}
    live = Allocation.objects.filter(released_at__isnull=True).values_list("job_id", "task__rank", "gpu_id")
    replicas: dict[int, list[str]] = {}
    for (job_id, _), gpus in groupby(raw_rows(live.order_by("job_id", "task__rank", "gpu_id")), key=_JOB_AND_RANK):
        if job_id in by_job:
            replicas.setdefault(job_id, []).append(",".join(str(g) for _, _, g in gpus))
    return [(*by_job[job_id], "|".join(reps)) for job_id, reps in replicas.items()]


_RUNNING_FIELDS = (
    "id",
    "team_id",
    "tier",
    "gpu_type",
    "start",
    "time_limit_s",
    "checkpoint",
    "priority",
    "submitted",
    "terminating",
    "cpus_per_replica",
    "memory_mb_per_replica",
    "name",
)
_JOB_AND_RANK = itemgetter(0, 1)


# What the core is told of a gang with no time limit (a service's replica, time_limit_s 0): it holds its
# GPUs for ten years, so no reservation or backfill counts on them coming free (a finite number keeps the
# core's arithmetic and the reasons people read in plain figures).
NO_TIME_LIMIT_S = 10 * 365 * 24 * 3600.0


def time_limit_of(limit_s: int) -> float:
    return float(limit_s) if limit_s else NO_TIME_LIMIT_S


def pending_jobs() -> QuerySet[Job]:
    """The pending jobs the core may place: not an array's tasks beyond its limit on tasks running at once."""
    return pending_placeable()


def _pending() -> tuple[PendingJob, ...]:
    fields = (
        "id", "team_id", "tier", "replicas", "gpus_per_replica", "gpu_type", "submitted", "time_limit_s", "priority",
        "leaf_locality", "cpus_per_replica", "memory_mb_per_replica", "one_fabric", "one_per_node", "name", "image",
    )  # fmt: skip
    return tuple(
        PendingJob(
            job_id=str(pk),
            team=unit_key(team_id),  # (a unit's name may change while its jobs run: ``_running`` compares them)
            tier=_TIERS[tier],
            replicas=replicas,
            gpus_per_replica=per,
            gpu_type=gpu_type,
            submit_time=submitted,
            time_limit=time_limit_of(limit_s),
            priority=priority,
            locality=_LOCALITIES[locality],
            cpus_per_replica=cpus,
            memory_mb_per_replica=memory_mb,
            one_fabric=one_fabric,
            one_per_node=one_per_node,
            name=name,
            # A job that names an image runs only on nodes with a container runtime (docs/containers.md).
            needs=WITH_CONTAINERS if image else NO_CAPABILITIES,
        )
        for (
            pk,
            team_id,
            tier,
            replicas,
            per,
            gpu_type,
            submitted,
            limit_s,
            priority,
            locality,
            cpus,
            memory_mb,
            one_fabric,
            one_per_node,
            name,
            image,
        ) in raw_rows(pending_jobs().annotate(submitted=Epoch("submitted_at")).values_list(*fields))
    )


def snapshot_build(*, now: datetime) -> Snapshot:
    """The core's input from the database: topology, running gangs, pending jobs, quota tree with decayed usage."""
    refresh_unit_keys()
    return Snapshot(
        topology=topology_cached(), running=_running(now), pending=_pending(), quotas=_quotas(now), config=scheduler_config()
    )
