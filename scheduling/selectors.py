"""Reads of jobs and the cluster, with the tenant check built in.

Views and tasks never filter jobs by tenant themselves: they call ``jobs_visible`` /
``access_job*``, so none can forget the check. ``snapshot_build`` is the one place that
turns database rows into the scheduler core's plain snapshot.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db import connection
from django.db.models import BooleanField, Count, ExpressionWrapper, F, FloatField, Func, Q, QuerySet
from django.db.models.functions import Coalesce
from django.http import Http404

from scheduling.core.capacity import Capacity, capacity_of
from scheduling.core.fairshare import CPU, MEMORY, RESOURCES
from scheduling.core.types import Config, LeafLocality, PendingJob, QuotaUnit, RunningJob, Snapshot, Tier, Topology
from scheduling.core.types import Gpu as CoreGpu
from scheduling.core.types import Node as CoreNode
from scheduling.models import Allocation, Gpu, Job, Node, NodeState, Task
from scheduling.states import ACTIVE_STATES, TASK_LIVE_STATES, TERMINAL_STATES, JobState
from tenants.models import OrgUnit, Quota, UnitKind
from tenants.selectors import AnyUser, is_cluster_admin, teams_led, units_visible

# --------------------------------------------------------------------------- jobs and access


def jobs_visible(*, user: AnyUser) -> QuerySet[Job]:
    """Jobs the user may read: their teams' (members, leads), their subtree's (org admins), all (cluster admins)."""
    if not user.is_authenticated:
        return Job.objects.none()
    if is_cluster_admin(user):
        return Job.objects.all()
    return Job.objects.filter(Q(team__in=units_visible(user=user)) | Q(user=user))


def access_job(*, user: AnyUser, pk: int | str) -> Job:
    """The job with ``pk`` if the user may read it; the same 404 as a missing one otherwise."""
    try:
        return jobs_visible(user=user).select_related("team", "user").get(pk=int(pk))
    except (Job.DoesNotExist, ValueError, TypeError, OverflowError):
        raise Http404("No such job") from None


def can_manage_job(*, user: AnyUser, job: Job) -> bool:
    """Owner, the team's lead, an org admin above the team, a cluster admin."""
    if not user.is_authenticated:
        return False
    if job.user_id == user.pk or is_cluster_admin(user):
        return True
    return teams_led(user=user).filter(pk=job.team_id).exists()


def access_job_manage(*, user: AnyUser, pk: int | str) -> Job:
    """The job if the user may act on it: 404 if they cannot see it, PermissionDenied if they only can see it."""
    job = access_job(user=user, pk=pk)
    if not can_manage_job(user=user, job=job):
        raise PermissionDenied("Only the job's owner, its team's lead or an admin above the team may do this")
    return job


def job_tasks(*, job: Job) -> list[Task]:
    """Tasks of the job's current attempt, rank order, with their nodes."""
    return list(job.tasks.filter(attempt=job.attempt).select_related("node__leaf").order_by("rank"))


# --------------------------------------------------------------------------- quotas and usage

_USAGE_CACHE_KEY = "yard:usage:v1"
_USAGE_CACHE_S = 30


def _decayed(start: datetime, end: datetime, now: datetime, half_life_s: float) -> float:
    """GPU-seconds of one GPU held over [start, end], each second decayed by its age at ``now``."""
    rate = math.log(2) / half_life_s
    age_end = max((now - end).total_seconds(), 0.0)
    age_start = max((now - start).total_seconds(), age_end)
    return (math.exp(-rate * age_end) - math.exp(-rate * age_start)) / rate


def decayed_usage(*, now: datetime) -> dict[int, dict[str, float]]:
    """Team id -> GPU type -> decayed GPU-seconds, from Allocation intervals.

    Cached for a few seconds in the shared cache: fair share moves on the scale of the
    half-life (days), so a 30-second-old figure orders teams the same; the cycle stays cheap
    at hundreds of nodes. Allocations older than ten half-lives weigh < 0.1 % and are skipped.
    """
    cached: dict[int, dict[str, float]] | None = cache.get(_USAGE_CACHE_KEY)
    if cached is not None:
        return cached
    half_life = yard_number("HALF_LIFE_S")
    horizon = now - timedelta(seconds=10 * half_life)
    rows = Allocation.objects.filter(Q(released_at__isnull=True) | Q(released_at__gte=horizon)).values_list(
        "job__team_id", "job__gpu_type", "allocated_at", "released_at", "job__cpus_per_replica",
        "job__memory_mb_per_replica", "job__gpus_per_replica",
    )  # fmt: skip
    usage: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for team_id, gpu_type, start, end, cpus, memory_mb, per in rows.iterator(chunk_size=5000):
        held = _decayed(start, end or now, now, half_life)
        usage[team_id][gpu_type] += held
        # The cores and memory that came with this GPU (its replica's, spread over the replica's GPUs).
        usage[team_id][CPU] += held * cpus / max(per, 1)
        usage[team_id][MEMORY] += held * memory_mb / max(per, 1)
    result = {team: dict(types) for team, types in usage.items()}
    cache.set(_USAGE_CACHE_KEY, result, _USAGE_CACHE_S)
    return result


def borrowed_beyond(*, used: int, guaranteed: int) -> int:
    """What a unit borrows of one GPU type: the GPUs it holds beyond its guarantee, max(0, used - guaranteed).

    The one definition of "borrowed" (the API, ``yard quota``, the dashboard, the quota page, the
    metrics and the monthly report all call this). It is the scheduler core's rule
    (scheduling/core/quota.py): a team's guarantee is claimed by its own running work, Tier 1 first,
    and what the team holds past it is borrowed (``guarantee_by_tier``). Borrowing is decided per team;
    a parent unit borrows what its teams do (the report sums them).

    Not the same figure as the GPUs of jobs flagged ``borrowed`` (``reclaimable`` below): the core flags
    a whole job that runs even partly beyond the guarantee, because a gang is reclaimed whole. A
    192-GPU gang that takes a team 97 GPUs past its guarantee makes 97 borrowed and 192 reclaimable.
    """
    return max(used - guaranteed, 0)


def quota_usage(*, team_ids: Iterable[int] | None = None) -> dict[int, dict[str, dict[str, Any]]]:
    """Team id -> GPU type -> ``guaranteed``, ``limit`` (None: none), ``used`` (live GPUs), ``borrowed``
    (live GPUs beyond the guarantee, ``borrowed_beyond``) and ``reclaimable`` (live GPUs of the team's
    jobs that run on borrowed quota: what a reclaim could take). Every team with a quota or live GPUs
    (only ``team_ids`` when given); two queries."""
    quotas = Quota.objects.filter(unit__kind=UnitKind.TEAM)
    live = Allocation.objects.filter(released_at__isnull=True)
    if team_ids is not None:
        team_ids = list(team_ids)
        quotas, live = Quota.objects.filter(unit_id__in=team_ids), live.filter(job__team_id__in=team_ids)
    result: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for quota in quotas:
        result[quota.unit_id][quota.gpu_type] = {"guaranteed": quota.guaranteed, "limit": quota.limit}
    rows = (
        live.values_list("job__team_id", "job__gpu_type")
        # the job's flag, not the allocation's: each cycle re-decides what runs beyond the guarantee
        .annotate(used=Count("id"), reclaimable=Count("id", filter=Q(job__borrowed=True)))
    )
    held = {(team_id, gpu_type): (used, reclaimable) for team_id, gpu_type, used, reclaimable in rows}
    for team_id, gpu_type in held:
        result[team_id].setdefault(gpu_type, {"guaranteed": 0, "limit": None})
    for team_id, types in result.items():
        for gpu_type, entry in types.items():
            used, reclaimable = held.get((team_id, gpu_type), (0, 0))
            entry["used"], entry["reclaimable"] = used, reclaimable
            entry["borrowed"] = borrowed_beyond(used=used, guaranteed=entry["guaranteed"])
    return dict(result)


def team_quota_usage(*, team: OrgUnit) -> dict[str, dict[str, Any]]:
    """Per GPU type: guaranteed, limit, used, borrowed (beyond the guarantee) and reclaimable (``quota_usage``)."""
    return quota_usage(team_ids=[team.pk]).get(team.pk, {})


def fairshare_capacity() -> dict[str, int]:
    """What fair share divides usage by, as the cycle's core does (``TopoIndex.share_capacity``): healthy
    GPUs per type, and the cores and memory jobs may be given on the nodes that say theirs."""
    capacity: dict[str, int] = dict(
        Gpu.objects.filter(healthy=True).values("gpu_type").annotate(n=Count("id")).values_list("gpu_type", "n")
    )
    reserve_cpus, reserve_mb = int(yard_number("SYSTEM_RESERVE_CPUS")), int(yard_number("SYSTEM_RESERVE_MEMORY_MB"))
    cores = memory = 0
    for cpus, memory_mb in Node.objects.values_list("cpus", "memory_mb"):
        cores += max(cpus - reserve_cpus, 1) if cpus else 0
        memory += max(memory_mb - reserve_mb, 1) if memory_mb else 0
    if cores or memory:
        capacity[CPU], capacity[MEMORY] = cores, memory
    return capacity


def fairshare_standing(*, now: datetime) -> dict[int, dict[str, Any]]:
    """Team id -> where the team stands in fair share: ``rank`` (1 goes first among teams), ``teams`` (how
    many), ``usage_gpu_hours`` per GPU type (decayed with the half-life), ``dominant_share`` of the
    cluster and ``weight``. The same quota tree, usage and order (scheduling/core/fairshare.py) the
    cycle uses, so `yard quota` says what the scheduler will do."""
    from scheduling.core.fairshare import team_order

    units = _quotas(now)
    capacity = fairshare_capacity()
    order = team_order(units, capacity)
    team_ids = set(OrgUnit.objects.filter(kind=UnitKind.TEAM).values_list("id", flat=True))
    by_key = {u.name: u for u in units}
    ids = {u.name: pk for u in units if (pk := unit_id_of(u.name)) is not None}
    ranked = sorted((order[u.name], ids[u.name]) for u in units if ids.get(u.name) in team_ids and u.name in order)
    totals: dict[str, float] = defaultdict(float)
    for _, team_id in ranked:
        for gpu_type, used in by_key[unit_key(team_id)].usage.items():
            totals[gpu_type] += used
    out: dict[int, dict[str, Any]] = {}
    for position, (_, team_id) in enumerate(ranked, start=1):
        unit = by_key[unit_key(team_id)]
        out[team_id] = {
            "rank": position,
            "teams": len(ranked),
            "usage_gpu_hours": {t: round(v / 3600, 3) for t, v in sorted(unit.usage.items()) if t not in RESOURCES},
            # the team's part of all teams' recent (decayed) use, per GPU type
            "usage_share": {
                t: round(v / totals[t], 4) for t, v in sorted(unit.usage.items()) if totals[t] > 0 and t not in RESOURCES
            },
            "weight": unit.weight,
        }
    return out


# --------------------------------------------------------------------------- the snapshot


# id -> slug of every org unit, refreshed by each snapshot (a unit renamed since shows under its new name).
_SLUGS: dict[int, str] = {}


def refresh_unit_keys() -> None:
    _SLUGS.clear()
    _SLUGS.update(OrgUnit.objects.values_list("id", "slug"))


def unit_key(unit_id: int) -> str:
    """The core's name for an org unit (and a job's team): its slug, so that every reason the scheduler
    writes names teams as people know them ("over team pretraining's quota"), never by id."""
    key = _SLUGS.get(unit_id)
    if key is None:
        refresh_unit_keys()
        key = _SLUGS.get(unit_id, str(unit_id))
    return key


def unit_id_of(key: str) -> int | None:
    """The org unit a core name stands for (the inverse of unit_key)."""
    for pk, slug in _SLUGS.items():
        if slug == key:
            return pk
    refresh_unit_keys()
    return next((pk for pk, slug in _SLUGS.items() if slug == key), None)


def _topology() -> Topology:
    """Every node (only READY ones schedulable) with its healthy GPUs. Plain tuples, no model instances:
    this runs at every cycle and every submit's admission check, over every GPU of the cluster."""
    node_rows = list(
        Node.objects.order_by("name").values_list(
            "id", "name", "leaf__name", "leaf__spine__name", "gpu_type", "state", "cpus", "memory_mb", "fabric_domain"
        )
    )
    node_types = {row[0]: row[4] for row in node_rows}
    gpus_by_node: dict[int, list[CoreGpu]] = defaultdict(list)
    # MIG instances (a type of their own, "H100.1g.10gb") by node and type: each such set is a core node
    # of its own (``core_node_name``), so a job of one type is only ever placed on GPUs of that type.
    slices: dict[int, dict[str, list[CoreGpu]]] = defaultdict(lambda: defaultdict(list))
    rows = Gpu.objects.filter(healthy=True).order_by("node_id", "index")
    for pk, node_id, index, nvlink, pcie, numa, gpu_type in rows.values_list(
        "id", "node_id", "index", "nvlink_domain", "pcie_switch", "numa_node", "gpu_type"
    ):
        gpu = CoreGpu(id=str(pk), index=index, nvlink=nvlink, pcie=pcie, numa=numa)
        if gpu_type and gpu_type != node_types.get(node_id):
            slices[node_id][gpu_type].append(gpu)
        else:
            gpus_by_node[node_id].append(gpu)
    # What jobs may be given of each node's cores and memory: what its agent reported less the system
    # reserve (0, "not known", stays 0: such a node is not held to it; a reserve larger leaves 1).
    reserve_cpus, reserve_mb = int(yard_number("SYSTEM_RESERVE_CPUS")), int(yard_number("SYSTEM_RESERVE_MEMORY_MB"))
    by_pk = {
        pk: CoreNode(
            name=name,
            leaf=leaf,
            spine=spine,
            gpu_type=gpu_type,
            gpus=tuple(gpus_by_node.get(pk, ())),
            schedulable=state == NodeState.READY,
            cpus=max(cpus - reserve_cpus, 1) if cpus else 0,
            memory_mb=max(memory_mb - reserve_mb, 1) if memory_mb else 0,
            fabric=fabric,
        )
        for pk, name, leaf, spine, gpu_type, state, cpus, memory_mb, fabric in node_rows
    }
    # A node's slices share its cores and memory with its whole GPUs; they are not held to them
    # (docs/scheduler-core.md, "MIG"): the whole GPUs' node is, and the agent limits each task.
    nodes = tuple(by_pk.values()) + tuple(
        replace(
            by_pk[node_id],
            name=core_node_name(by_pk[node_id].name, gpu_type),
            gpu_type=gpu_type,
            gpus=tuple(gpus),
            cpus=0,
            memory_mb=0,
        )
        for node_id, by_type in sorted(slices.items())
        for gpu_type, gpus in sorted(by_type.items())
    )
    return Topology(nodes=nodes)


MIG_NODE_MARK = "~"  # "h100-03~H100.1g.10gb": the core's node for one node's MIG instances of one type


def core_node_name(node_name: str, gpu_type: str) -> str:
    return f"{node_name}{MIG_NODE_MARK}{gpu_type}"


def node_name_of(core_name: str) -> str:
    """The node a core node name stands for (its MIG instances' core node names the node too)."""
    return core_name.split(MIG_NODE_MARK, 1)[0]


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
                time_limit=float(limit_s),
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


def pending_jobs() -> QuerySet[Job]:
    return Job.objects.filter(state=JobState.PENDING)


def _pending() -> tuple[PendingJob, ...]:
    fields = (
        "id", "team_id", "tier", "replicas", "gpus_per_replica", "gpu_type", "submitted_at", "time_limit_s", "priority",
        "leaf_locality", "cpus_per_replica", "memory_mb_per_replica", "one_fabric", "one_per_node", "name",
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
            time_limit=float(limit_s),
            priority=priority,
            locality=LeafLocality(locality),
            cpus_per_replica=cpus,
            memory_mb_per_replica=memory_mb,
            one_fabric=one_fabric,
            one_per_node=one_per_node,
            name=name,
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
        ) in pending_jobs().values_list(*fields)
    )


def _quotas(now: datetime) -> tuple[QuotaUnit, ...]:
    usage = decayed_usage(now=now)
    quotas: dict[int, list[Quota]] = defaultdict(list)
    for q in Quota.objects.all():
        quotas[q.unit_id].append(q)
    units = []
    for unit in OrgUnit.objects.only("id", "parent_id").order_by("path"):
        qs = quotas.get(unit.pk, [])
        # Siblings share idle capacity by weight; a unit's weight is the same for every GPU type in
        # the core's model, so take the first quota's (they are set together in the quota editor).
        weight = qs[0].weight if qs else 1.0
        units.append(
            QuotaUnit(
                name=unit_key(unit.pk),
                parent=unit_key(unit.parent_id) if unit.parent_id else None,
                guaranteed={q.gpu_type: q.guaranteed for q in qs},
                limit={q.gpu_type: q.limit for q in qs if q.limit is not None},
                weight=weight,
                usage=usage.get(unit.pk, {}),
            )
        )
    return tuple(units)


_TOPOLOGY: dict[str, Any] = {"key": None, "value": None, "capacity": None, "at": 0.0}
_TOPOLOGY_MAX_AGE_S = 30.0


def _topology_key() -> tuple[object, ...]:
    """What changes when the topology does: the node set, any node's state, the set of unhealthy GPUs.

    One statement of index-only aggregates (every submission's admission check asks it), where reading
    the topology reads every GPU."""
    node, gpu = Node._meta.db_table, Gpu._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(id), MAX(id), MAX(state_changed_at), "
            f"SUM(CASE WHEN state = %s THEN 1 ELSE 0 END), SUM(CASE WHEN state = %s THEN id ELSE 0 END), "
            f"(SELECT COUNT(id) FROM {gpu} WHERE NOT healthy), (SELECT SUM(id) FROM {gpu} WHERE NOT healthy) "
            f"FROM {node}",
            [NodeState.READY, NodeState.READY],
        )
        return tuple(cursor.fetchone())


def topology_cached() -> Topology:
    """The topology (every node, only READY ones schedulable, healthy GPUs), reused while unchanged.

    The same object for consecutive cycles also lets the core reuse its index of it (TopoIndex is cached
    on the object's identity). Rebuilt when the key changes and at least every half minute.
    """
    key = _topology_key()
    now = time.monotonic()
    if _TOPOLOGY["key"] != key or now - _TOPOLOGY["at"] > _TOPOLOGY_MAX_AGE_S:
        topology = _topology()
        _TOPOLOGY.update(key=key, value=topology, capacity=capacity_of(topology), at=now)
    return cast(Topology, _TOPOLOGY["value"])


def cluster_capacity() -> Capacity:
    """The cluster's shape for the admission check (scheduling/core/capacity.py), cached with the topology."""
    topology_cached()
    return cast(Capacity, _TOPOLOGY["capacity"])


def quota_chain(*, team: OrgUnit, gpu_type: str) -> tuple[QuotaUnit, ...]:
    """The team and its ancestors with their guarantees and limits of one GPU type: all the quota tree
    the admission check needs (one query)."""
    ids = [int(part) for part in team.path.strip("/").split("/") if part] or [team.pk]
    units = {u.pk: u for u in OrgUnit.objects.filter(pk__in=ids).only("id", "parent_id", "slug")}
    _SLUGS.update({pk: u.slug for pk, u in units.items()})
    quotas = {q.unit_id: q for q in Quota.objects.filter(unit_id__in=ids, gpu_type=gpu_type)}
    return tuple(
        QuotaUnit(
            name=unit_key(pk),
            parent=unit_key(units[pk].parent_id) if units[pk].parent_id else None,  # type: ignore[arg-type]
            guaranteed={gpu_type: quotas[pk].guaranteed} if pk in quotas else {},
            limit={gpu_type: quotas[pk].limit} if pk in quotas and quotas[pk].limit is not None else {},  # type: ignore[dict-item]
        )
        for pk in ids
        if pk in units
    )


def quota_tree(*, now: datetime) -> tuple[QuotaUnit, ...]:
    """The quota tree with each unit's decayed usage, as the cycle's snapshot holds it."""
    return _quotas(now)


def yard_number(name: str) -> float:
    """A number from settings.YARD (typed there as a plain dict)."""
    return float(cast(float, settings.YARD[name]))


def scheduler_config() -> Config:
    return Config(
        half_life_s=yard_number("HALF_LIFE_S"),
        grace_period_s=yard_number("GRACE_PERIOD_S"),
        min_runtime_s=yard_number("MIN_RUNTIME_S"),
        span_slowdown=yard_number("SPAN_SLOWDOWN"),
    )


def snapshot_build(*, now: datetime) -> Snapshot:
    """The core's input from the database: topology, running gangs, pending jobs, quota tree with decayed usage."""
    refresh_unit_keys()
    return Snapshot(
        topology=topology_cached(), running=_running(now), pending=_pending(), quotas=_quotas(now), config=scheduler_config()
    )


# --------------------------------------------------------------------------- invariants


def invariant_violations() -> list[str]:
    """What must never be true, whatever crashed or raced: empty when the cluster state is sound.

    - a GPU in two live allocations;
    - a half-placed gang: an active job whose current attempt lacks a task per replica, or a live
      task without exactly gpus_per_replica live allocations;
    - live allocations of a task that is no longer live, or of a pending or finished job.
    """
    problems: list[str] = []
    for gpu_id, n in (
        Allocation.objects.filter(released_at__isnull=True)
        .values("gpu_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("gpu_id", "n")
    ):
        problems.append(f"GPU {gpu_id} has {n} live allocations")
    for job in (
        Job.objects.filter(state__in=ACTIVE_STATES)
        .annotate(ntasks=Count("tasks", filter=Q(tasks__attempt=F("attempt"))))
        .exclude(ntasks=F("replicas"))
        .values_list("id", "ntasks", "replicas")
    ):
        problems.append(f"job {job[0]} is active with {job[1]} tasks for {job[2]} replicas")
    for task_id, job_id, n, want in (
        Task.objects.filter(state__in=TASK_LIVE_STATES)
        .annotate(n=Count("allocations", filter=Q(allocations__released_at__isnull=True)))
        .exclude(n=F("job__gpus_per_replica"))
        .values_list("id", "job_id", "n", "job__gpus_per_replica")
    ):
        problems.append(f"task {task_id} of job {job_id} is live with {n} live allocations, needs {want}")
    stray = Allocation.objects.filter(released_at__isnull=True).filter(
        ~Q(task__state__in=TASK_LIVE_STATES) | Q(job__state=JobState.PENDING) | Q(job__state__in=TERMINAL_STATES)
    )
    for alloc_id, job_id, state in stray.values_list("id", "job_id", "job__state"):
        problems.append(f"allocation {alloc_id} of job {job_id} ({state}) is live but its task or job is not")
    return problems


# --------------------------------------------------------------------------- logs

LOG_READ_MAX_BYTES = 1024 * 1024


def task_log_read(*, task: Task, offset: int, max_bytes: int = LOG_READ_MAX_BYTES) -> tuple[str, int]:
    """The task's log from byte ``offset`` (UTF-8 bytes of the agent's stream), at most ``max_bytes``; and the next offset.

    Follow a log by calling again with the returned offset: it equals ``offset`` while nothing new came.
    """
    first = task.log_chunks.filter(offset__lte=offset).order_by("-offset").values_list("offset", flat=True).first()
    chunks = task.log_chunks.filter(offset__gte=first if first is not None else offset).order_by("offset")
    parts: list[bytes] = []
    size = 0
    position = offset
    for chunk_offset, data in chunks.values_list("offset", "data").iterator(chunk_size=100):
        raw = data.encode("utf-8")
        if chunk_offset + len(raw) <= position:
            continue
        piece = raw[max(position - chunk_offset, 0) :]
        if chunk_offset > position:  # a hole (a lost chunk): skip to what we have
            position = chunk_offset
        piece = piece[: max_bytes - size]
        parts.append(piece)
        size += len(piece)
        position += len(piece)
        if size >= max_bytes:
            break
    return b"".join(parts).decode("utf-8", errors="replace"), max(position, offset)


def task_log_tail(*, task: Task, lines: int) -> tuple[str, int]:
    """The last ``lines`` lines of the task's log, and the offset to follow on from."""
    collected: list[str] = []
    end = 0
    newlines = 0
    for chunk_offset, data in task.log_chunks.order_by("-offset").values_list("offset", "data").iterator(chunk_size=50):
        end = max(end, chunk_offset + len(data.encode("utf-8")))
        collected.append(data)
        newlines += data.count("\n")
        if newlines > lines or sum(len(c) for c in collected) > LOG_READ_MAX_BYTES:
            break
    text = "".join(reversed(collected))
    kept = text.splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept), end
