"""Reads of jobs and the cluster, with the tenant check built in.

Views and tasks never filter jobs by tenant themselves: they call ``jobs_visible`` /
``access_job*``, so none can forget the check. ``snapshot_build`` is the one place that
turns database rows into the scheduler core's plain snapshot.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import PermissionDenied
from django.db.models import Count, F, Q, QuerySet
from django.http import Http404

from scheduling.core.types import Config, PendingJob, QuotaUnit, RunningJob, Snapshot, Tier, Topology
from scheduling.core.types import Gpu as CoreGpu
from scheduling.core.types import Node as CoreNode
from scheduling.models import Allocation, Gpu, Job, Node, NodeState, Task
from scheduling.states import ACTIVE_STATES, TASK_LIVE_STATES, TERMINAL_STATES, JobState
from tenants.models import OrgUnit, Quota
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
        "job__team_id", "job__gpu_type", "allocated_at", "released_at"
    )
    usage: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for team_id, gpu_type, start, end in rows.iterator(chunk_size=5000):
        usage[team_id][gpu_type] += _decayed(start, end or now, now, half_life)
    result = {team: dict(types) for team, types in usage.items()}
    cache.set(_USAGE_CACHE_KEY, result, _USAGE_CACHE_S)
    return result


def team_quota_usage(*, team: OrgUnit) -> dict[str, dict[str, Any]]:
    """Per GPU type: guaranteed, limit (None: none), used (live GPUs), borrowed (live GPUs beyond the guarantee)."""
    result: dict[str, dict[str, Any]] = {}
    for quota in Quota.objects.filter(unit=team):
        result[quota.gpu_type] = {"guaranteed": quota.guaranteed, "limit": quota.limit, "used": 0, "borrowed": 0}
    live = (
        Allocation.objects.filter(job__team=team, released_at__isnull=True)
        .values("job__gpu_type")
        # the job's flag, not the allocation's: each cycle re-decides what runs beyond the guarantee
        .annotate(used=Count("id"), borrowed=Count("id", filter=Q(job__borrowed=True)))
    )
    for row in live:
        entry = result.setdefault(row["job__gpu_type"], {"guaranteed": 0, "limit": None, "used": 0, "borrowed": 0})
        entry["used"], entry["borrowed"] = row["used"], row["borrowed"]
    return result


# --------------------------------------------------------------------------- the snapshot


def unit_key(unit_id: int) -> str:
    """The core's name for an org unit (and a job's team)."""
    return str(unit_id)


def _topology() -> Topology:
    """Every node (only READY ones schedulable) with its healthy GPUs. Plain tuples, no model instances:
    this runs at every cycle and every submit's admission check, over every GPU of the cluster."""
    gpus_by_node: dict[int, list[CoreGpu]] = defaultdict(list)
    rows = Gpu.objects.filter(healthy=True).order_by("node_id", "index")
    for pk, node_id, index, nvlink, pcie, numa in rows.values_list(
        "id", "node_id", "index", "nvlink_domain", "pcie_switch", "numa_node"
    ):
        gpus_by_node[node_id].append(CoreGpu(id=str(pk), index=index, nvlink=nvlink, pcie=pcie, numa=numa))
    nodes = tuple(
        CoreNode(
            name=name,
            leaf=leaf,
            spine=spine,
            gpu_type=gpu_type,
            gpus=tuple(gpus_by_node.get(pk, ())),
            schedulable=state == NodeState.READY,
        )
        for pk, name, leaf, spine, gpu_type, state in Node.objects.order_by("name").values_list(
            "id", "name", "leaf__name", "leaf__spine__name", "gpu_type", "state"
        )
    )
    return Topology(nodes=nodes)


def _running(now: datetime) -> tuple[RunningJob, ...]:
    jobs = {j.pk: j for j in Job.objects.filter(state__in=ACTIVE_STATES)}
    replicas: dict[int, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    live = Allocation.objects.filter(released_at__isnull=True, job_id__in=list(jobs)).values_list(
        "job_id", "task__rank", "gpu_id"
    )
    for job_id, rank, gpu_id in live.order_by("job_id", "task__rank", "gpu_id"):
        replicas[job_id][rank].append(str(gpu_id))
    out: list[RunningJob] = []
    for job_id, ranks in replicas.items():
        job = jobs[job_id]
        start = job.started_at or job.state_changed_at
        out.append(
            RunningJob(
                job_id=str(job_id),
                team=unit_key(job.team_id),
                tier=Tier(job.tier),
                gpu_type=job.gpu_type,
                replicas=tuple(tuple(ranks[r]) for r in sorted(ranks)),
                start=start.timestamp(),
                time_limit=float(job.time_limit_s),
                last_checkpoint=job.last_checkpoint_at.timestamp() if job.last_checkpoint_at else None,
                priority=job.priority,
                submit_time=job.submitted_at.timestamp(),
                terminating=job.stop_requested_at is not None,
            )
        )
    return tuple(out)


def pending_jobs() -> QuerySet[Job]:
    return Job.objects.filter(state=JobState.PENDING)


def _pending() -> tuple[PendingJob, ...]:
    return tuple(
        PendingJob(
            job_id=str(job.pk),
            team=unit_key(job.team_id),
            tier=Tier(job.tier),
            replicas=job.replicas,
            gpus_per_replica=job.gpus_per_replica,
            gpu_type=job.gpu_type,
            submit_time=job.submitted_at.timestamp(),
            time_limit=float(job.time_limit_s),
            priority=job.priority,
        )
        for job in pending_jobs().only(
            "id", "team_id", "tier", "replicas", "gpus_per_replica", "gpu_type", "submitted_at", "time_limit_s", "priority"
        )
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


def yard_number(name: str) -> float:
    """A number from settings.YARD (typed there as a plain dict)."""
    return float(cast(float, settings.YARD[name]))


def scheduler_config() -> Config:
    return Config(
        half_life_s=yard_number("HALF_LIFE_S"),
        grace_period_s=yard_number("GRACE_PERIOD_S"),
        min_runtime_s=yard_number("MIN_RUNTIME_S"),
    )


def snapshot_build(*, now: datetime) -> Snapshot:
    """The core's input from the database: topology, running gangs, pending jobs, quota tree with decayed usage."""
    return Snapshot(
        topology=_topology(), running=_running(now), pending=_pending(), quotas=_quotas(now), config=scheduler_config()
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
