"""``snapshot_build``: the one place that turns database rows into the scheduler core's plain snapshot
(topology, running gangs, pending jobs, the quota tree with decayed usage, the config).

The running and pending jobs are read here, as flat rows (this runs at every cycle over thousands of
jobs); the topology and the quota tree come from ``topology`` and ``quotas``, which other reads use alone.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

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


def _running(now: datetime) -> tuple[RunningJob, ...]:
    """Every gang holding GPUs, from two flat queries (no model instances, no id list: this runs at every
    cycle over thousands of running jobs, and every live allocation belongs to an active job)."""
    jobs = {
        row[0]: row
        for row in Job.objects.filter(state__in=ACTIVE_STATES)
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
    }
    replicas: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    live = Allocation.objects.filter(released_at__isnull=True).values_list("job_id", "task__rank", "gpu_id")
    for job_id, rank, gpu_id in live.order_by("job_id", "task__rank", "gpu_id"):
        if job_id in jobs:  # (an allocation of a job that is no longer active is an invariant violation, reported elsewhere)
            replicas[job_id][rank].append(str(gpu_id))
    out: list[RunningJob] = []
    for job_id, ranks in replicas.items():
        _, team_id, tier, gpu_type, start, limit_s, checkpoint, priority, submitted, terminating, cpus, memory_mb, name = jobs[
            job_id
        ]
        out.append(
            RunningJob(
                job_id=str(job_id),
                team=unit_key(team_id),
                tier=Tier(tier),
                gpu_type=gpu_type,
                replicas=tuple(tuple(ranks[r]) for r in sorted(ranks)),
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
        )
    return tuple(out)


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
        "id", "team_id", "tier", "replicas", "gpus_per_replica", "gpu_type", "submitted_at", "time_limit_s", "priority",
        "leaf_locality", "cpus_per_replica", "memory_mb_per_replica", "one_fabric", "one_per_node", "name", "image",
    )  # fmt: skip
    return tuple(
        PendingJob(
            job_id=str(pk),
            team=unit_key(team_id),
            tier=Tier(tier),
            replicas=replicas,
            gpus_per_replica=per,
            gpu_type=gpu_type,
            submit_time=submitted.timestamp(),
            time_limit=time_limit_of(limit_s),
            priority=priority,
            locality=LeafLocality(locality),
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
        ) in pending_jobs().values_list(*fields)
    )


def snapshot_build(*, now: datetime) -> Snapshot:
    """The core's input from the database: topology, running gangs, pending jobs, quota tree with decayed usage."""
    refresh_unit_keys()
    return Snapshot(
        topology=topology_cached(), running=_running(now), pending=_pending(), quotas=_quotas(now), config=scheduler_config()
    )
