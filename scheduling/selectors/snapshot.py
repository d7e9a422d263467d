"""``snapshot_build``: the one place that turns database rows into the scheduler core's plain snapshot
(topology, running gangs, pending jobs, the quota tree with decayed usage, the config).

The running and pending jobs are read here, as flat rows (this runs at every cycle over thousands of
jobs); the topology and the quota tree come from ``topology`` and ``quotas``, which other reads use alone.
"""

from __future__ import annotations

from datetime import datetime
from itertools import groupby
from operator import itemgetter
from typing import Any

from django.db import connection
from django.db.models import BooleanField, ExpressionWrapper, FloatField, Func, Q, QuerySet
from django.db.models.functions import Coalesce

from scheduling.core.types import NO_CAPABILITIES, WITH_CONTAINERS, LeafLocality, PendingJob, RunningJob, Snapshot, Tier
from scheduling.models import Allocation, Job
from scheduling.selectors.arrays import pending_placeable
from scheduling.selectors.config import scheduler_config
from scheduling.selectors.quotas import _quotas, refresh_unit_keys, unit_key
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
# The running jobs of the last snapshot by their row: a job whose row and GPUs have not changed is the
# same RunningJob object as before, not a new one (a frozen dataclass of 14 fields costs microseconds to
# build, and 8,000 of them every cycle added up; the core compares them cheaply when they are the same).
_last_running: dict[tuple[Any, ...], RunningJob] = {}


def _running(now: datetime) -> tuple[RunningJob, ...]:
    """Every gang holding GPUs, from two flat queries (no model instances, no id list: this runs at every
    cycle over thousands of running jobs, and every live allocation belongs to an active job)."""
    global _last_running
    jobs = {
        row[0]: row
        for row in raw_rows(
            Job.objects.filter(state__in=ACTIVE_STATES)
            .annotate(
                start=Epoch(Coalesce("started_at", "state_changed_at")),
                checkpoint=Epoch("last_checkpoint_at"),
                submitted=Epoch("submitted_at"),
                terminating=ExpressionWrapper(Q(stop_requested_at__isnull=False), output_field=BooleanField()),
            )
            .values_list(
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
        )
    }
    live = Allocation.objects.filter(released_at__isnull=True).values_list("job_id", "task__rank", "gpu_id")
    replicas: dict[int, list[tuple[str, ...]]] = {}
    # (an allocation of a job that is no longer active is an invariant violation, reported elsewhere)
    for (job_id, _), gpus in groupby(raw_rows(live.order_by("job_id", "task__rank", "gpu_id")), key=_JOB_AND_RANK):
        if job_id in jobs:
            replicas.setdefault(job_id, []).append(tuple([str(g) for _, _, g in gpus]))
    memo, out = _last_running, []
    current: dict[tuple[Any, ...], RunningJob] = {}
    for job_id, reps in replicas.items():
        row = jobs[job_id]
        team = unit_key(row[1])  # (a unit's name may change while its jobs run)
        key = (row, team, *reps)
        job = memo.get(key)
        if job is None:
            _, _, tier, gpu_type, start, limit_s, checkpoint, priority, submitted, terminating, cpus, memory_mb, name = row
            job = RunningJob(
                job_id=str(job_id),
                team=team,
                tier=_TIERS[tier],
                gpu_type=gpu_type,
                replicas=tuple(reps),
                start=start,
                time_limit=time_limit_of(limit_s),
                last_checkpoint=checkpoint,
                priority=priority,
                submit_time=submitted,
                terminating=bool(terminating),
                cpus_per_replica=cpus,
                memory_mb_per_replica=memory_mb,
                name=name,
            )
        current[key] = job
        out.append(job)
    _last_running = current
    return tuple(out)


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
            team=unit_key(team_id),
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
