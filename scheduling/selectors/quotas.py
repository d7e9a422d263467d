"""The quota tree as the core sees it: org units named by key (their slugs), each unit's guarantees,
limits, weight and decayed usage; a team's chain for the admission check; where a team stands in fair share.

Apart from ``usage`` (the figures, read alone by pages and metrics) and ``snapshot`` (which holds this
tree beside the topology and the jobs): the names given here (``unit_key``) are how every other read
of the core's input names a team.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from django.db.models import FilteredRelation, Q, QuerySet

from scheduling.core.fairshare import RESOURCES
from scheduling.core.types import QuotaUnit
from scheduling.selectors.usage import decayed_usage, fairshare_capacity
from tenants.compiled import CompiledQuery
from tenants.models import OrgUnit, Quota, UnitKind

# id -> slug of every org unit, refreshed by each snapshot (a unit renamed since shows under its new name).
_SLUGS: dict[int, str] = {}


def refresh_unit_keys() -> None:
    _SLUGS.clear()
    _SLUGS.update(OrgUnit.objects.values_list("id", "slug"))


def unit_keys_now() -> dict[int, str]:
    """Every unit's key as ``refresh_unit_keys`` last read them (a copy)."""
    return dict(_SLUGS)


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


def _chain_rows(*args: Any) -> QuerySet[Any, Any]:
    """Each unit of the chain (``args``: the ids, then the GPU type) with its quota of this GPU type, if it
    has one, in one statement (a LEFT JOIN)."""
    *ids, gpu_type = args
    return (
        OrgUnit.objects.filter(pk__in=ids)
        .annotate(q=FilteredRelation("quotas", condition=Q(quotas__gpu_type=gpu_type)))
        .values_list("id", "parent_id", "slug", "q__id", "q__guaranteed", "q__limit")
        .order_by()
    )


# Compiled once per thread and chain length (tenants/compiled.py): every submission reads its chain.
_CHAINS: dict[int, CompiledQuery[OrgUnit]] = {}


def _chain_query(depth: int) -> CompiledQuery[OrgUnit]:
    query = _CHAINS.get(depth)
    if query is None:
        sentinels = [-7_340_033 - i for i in range(depth)]
        query = _CHAINS.setdefault(depth, CompiledQuery(_chain_rows, *sentinels, "\x00gpu-type-sentinel"))
    return query


def quota_chain(*, team: OrgUnit, gpu_type: str) -> tuple[QuotaUnit, ...]:
    """The team and its ancestors with their guarantees and limits of one GPU type: all the quota tree
    the admission check needs (one query)."""
    ids = [int(part) for part in team.path.strip("/").split("/") if part] or [team.pk]
    rows = _chain_query(len(ids)).rows(*ids, gpu_type)
    units = {pk: (parent_id, quota_id, guaranteed, limit) for pk, parent_id, slug, quota_id, guaranteed, limit in rows}
    _SLUGS.update({pk: slug for pk, _, slug, *_ in rows})
    return tuple(
        QuotaUnit(
            name=unit_key(pk),
            parent=unit_key(parent_id) if parent_id else None,
            guaranteed={gpu_type: guaranteed} if quota_id is not None else {},
            limit={gpu_type: limit} if quota_id is not None and limit is not None else {},
        )
        for pk in ids
        if pk in units
        for parent_id, quota_id, guaranteed, limit in [units[pk]]
    )


def quota_tree(*, now: datetime) -> tuple[QuotaUnit, ...]:
    """The quota tree with each unit's decayed usage, as the cycle's snapshot holds it."""
    return _quotas(now)


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
