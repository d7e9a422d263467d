"""Usage: decayed GPU-seconds per team (what fair share orders by), quota usage (guaranteed, used,
borrowed, reclaimable) and what fair share divides usage by.

Apart from ``quotas`` (the quota tree as the core sees it, which reads the decayed usage) and the
snapshot: the dashboard, the quota page, the API and the metrics read these without a snapshot.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Q

from scheduling.core.fairshare import CPU, MEMORY
from scheduling.models import Allocation, Gpu, Node
from scheduling.selectors.config import yard_number
from tenants.models import OrgUnit, Quota, UnitKind

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
