"""Why a team stands where it does in fair share: the reads behind the fair-share page and its API.

The order is the scheduler's own: the same quota tree with the same decayed usage (selectors'
``quota_tree``, what the cycle's snapshot holds) and the same ``scheduling.core.fairshare.team_order``. This
module only explains it, level by level up the tree, as Slurm's ``sshare`` and Fair Tree do: at each
level the siblings are ordered by dominant share / weight (lowest first), and a team's standing is its
place among its siblings, then its parent's among theirs, up to the root.

"What would change it", per level: decay alone never reorders siblings (every unit's use halves every
half-life alike); the order changes when one uses more than the other from now on, or when an admin
changes a weight. The page gives both figures: the GPU-hours of the dominant type that would swap a
unit with its neighbour, and the weight that would.

Who sees what: members see their own teams' standing and, at each level, the names, decayed usage and
weights of the siblings on their path, as ``sshare`` shows every account; no jobs of other teams.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from scheduling.core.fairshare import RESOURCES, dominant_share, team_order
from scheduling.core.types import QuotaUnit
from scheduling.selectors import fairshare_capacity, quota_tree, unit_key, yard_number
from tenants.models import OrgUnit, Role, UnitKind
from tenants.selectors import access_unit, teams_visible, user_roles


@dataclass(frozen=True)
class Standing:
    """One unit among its siblings."""

    unit: OrgUnit
    place: int  # 1 goes first among its siblings
    usage_gpu_hours: dict[str, float]  # decayed, of the unit's whole subtree
    dominant_type: str | None
    dominant_share: float  # decayed GPU-hours of the dominant type per GPU of that type in the cluster
    weight: float
    value: float  # dominant_share / weight: the key the siblings are ordered by

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": {"id": self.unit.pk, "name": self.unit.name, "slug": self.unit.slug, "kind": self.unit.kind},
            "place": self.place,
            "usage_gpu_hours": self.usage_gpu_hours,
            "dominant_type": self.dominant_type,
            "dominant_share": round(self.dominant_share, 6),
            "weight": self.weight,
            "ordering_value": round(self.value, 6),
        }


@dataclass
class Level:
    """The siblings under ``parent`` with the unit on the team's path among them."""

    parent: OrgUnit | None
    unit: OrgUnit
    siblings: list[Standing]
    changes: list[str] = field(default_factory=list)

    @property
    def mine(self) -> Standing:
        return next(s for s in self.siblings if s.unit.pk == self.unit.pk)

    def as_dict(self) -> dict[str, Any]:
        return {
            "parent": None if self.parent is None else {"id": self.parent.pk, "name": self.parent.name},
            "unit": {"id": self.unit.pk, "name": self.unit.name},
            "place": self.mine.place,
            "of": len(self.siblings),
            "siblings": [s.as_dict() for s in self.siblings],
            "what_would_change_it": self.changes,
        }


@dataclass
class TeamStanding:
    team: OrgUnit
    rank: int  # 1 is served first among all teams (in a tier, after work within guarantees)
    teams: int
    usage_gpu_hours: dict[str, float]
    levels: list[Level]  # the team's own level first, then up to the root's children

    def as_dict(self) -> dict[str, Any]:
        return {
            "team": {"id": self.team.pk, "name": self.team.name, "slug": self.team.slug},
            "rank": self.rank,
            "teams": self.teams,
            "usage_gpu_hours": self.usage_gpu_hours,
            "levels": [level.as_dict() for level in self.levels],
        }


@dataclass
class FairShare:
    half_life_days: float
    capacity: dict[str, int]
    teams: list[TeamStanding]

    def as_dict(self) -> dict[str, Any]:
        return {
            "half_life_days": self.half_life_days,
            "capacity": self.capacity,
            "teams": [t.as_dict() for t in self.teams],
        }


def fairshare_teams(*, user: object, team: str = "") -> list[OrgUnit]:
    """The teams asked for: ``team`` (an id or slug the user may see; else 404), or the user's own teams
    (member or lead), or, for an admin with none, the teams they can see."""
    if team:
        if team.isdigit():
            unit = access_unit(user=user, pk=team)  # type: ignore[arg-type]
        else:
            found = teams_visible(user=user).filter(slug=team).first()  # type: ignore[arg-type]
            unit = access_unit(user=user, pk=found.pk if found else 0)  # type: ignore[arg-type]
        return [unit]
    own = [unit for unit, role in user_roles(user=user) if role in (Role.MEMBER, Role.TEAM_LEAD)]  # type: ignore[arg-type]
    return own or list(teams_visible(user=user).order_by("path")[:12])  # type: ignore[arg-type]


def _hours(usage: dict[str, float]) -> dict[str, float]:
    """GPU-hours per GPU type (the cores and memory that count in the dominant share are not GPU-hours)."""
    return {t: round(v / 3600, 1) for t, v in sorted(usage.items()) if t not in RESOURCES}


def fairshare_explain(*, teams: list[OrgUnit], now: datetime) -> FairShare:
    """The standing of each of ``teams`` (the caller checked the user may see them), one query set for all."""
    units = quota_tree(now=now)
    capacity = fairshare_capacity()
    order = team_order(units, capacity)
    rows = {unit_key(u.pk): u for u in OrgUnit.objects.all()}
    by_key = {u.name: u for u in units}
    children: dict[str | None, list[str]] = defaultdict(list)
    for u in units:
        children[u.parent if u.parent in by_key else None].append(u.name)
    totals = _subtree_usage(by_key, children)

    def standing_of(key: str, place: int) -> Standing:
        usage = totals.get(key, {})
        share = dominant_share(usage, capacity)
        dominant = max((t for t in usage if capacity.get(t, 0) > 0), key=lambda t: (usage[t] / capacity[t], t), default=None)
        weight = by_key[key].weight
        return Standing(rows[key], place, _hours(usage), dominant, share / 3600, weight, _value(share, weight) / 3600)

    team_keys = [k for k, row in rows.items() if row.kind == UnitKind.TEAM and k in order]
    ranked = sorted(team_keys, key=lambda k: order[k])
    out: list[TeamStanding] = []
    for team in teams:
        key = unit_key(team.pk)
        if key not in by_key:
            continue
        levels: list[Level] = []
        walk: str | None = key
        seen: set[str] = set()
        while walk is not None and walk in by_key and walk not in seen:
            seen.add(walk)
            parent = by_key[walk].parent if by_key[walk].parent in by_key else None
            # The core's order among these siblings: by (dominant share / weight, name), lowest first.
            siblings = sorted(
                children[parent], key=lambda k: (_value(dominant_share(totals.get(k, {}), capacity), by_key[k].weight), k)
            )
            level = Level(rows[parent] if parent else None, rows[walk], [standing_of(k, i) for i, k in enumerate(siblings, 1)])
            level.changes = _what_would_change(level, capacity)
            if parent is not None or len(siblings) > 1:
                levels.append(level)
            walk = parent
        out.append(
            TeamStanding(
                team=team,
                rank=ranked.index(key) + 1 if key in ranked else 0,
                teams=len(ranked),
                usage_gpu_hours=_hours(totals.get(key, {})),
                levels=levels,
            )
        )
    return FairShare(yard_number("HALF_LIFE_S") / 86400, dict(sorted(capacity.items())), out)


def _value(share: float, weight: float) -> float:
    return share / weight if weight > 0 else float("inf")


def _subtree_usage(by_key: dict[str, QuotaUnit], children: dict[str | None, list[str]]) -> dict[str, dict[str, float]]:
    """A unit's usage is its teams' (the core's rule: usage given on inner units is ignored)."""
    totals: dict[str, dict[str, float]] = {}
    for key in sorted(by_key, key=lambda k: -_depth(k, by_key)):  # deepest first: children before parents
        kids = children.get(key, [])
        if not kids:
            totals[key] = dict(by_key[key].usage)
            continue
        acc: dict[str, float] = defaultdict(float)
        for kid in kids:
            for t, v in totals.get(kid, {}).items():
                acc[t] += v
        totals[key] = dict(acc)
    return totals


def _depth(key: str, by_key: dict[str, QuotaUnit]) -> int:
    depth, seen = 0, set()
    walk = by_key[key].parent
    while walk is not None and walk in by_key and walk not in seen:
        seen.add(walk)
        depth += 1
        walk = by_key[walk].parent
    return depth


def _what_would_change(level: Level, capacity: dict[str, int]) -> list[str]:
    """Plain sentences: how much more use, or which weight, would move the unit one place."""
    me = level.mine
    if len(level.siblings) == 1:
        return [f"{me.unit.name} is alone under {level.parent.name if level.parent else 'the cluster'}: nothing to order here."]
    out: list[str] = []
    if me.place > 1:
        ahead = level.siblings[me.place - 2]
        gpu_type = ahead.dominant_type or me.dominant_type
        if gpu_type and ahead.weight > 0 and me.weight > 0:
            # ahead overtakes me when its share / weight exceeds mine: share(ahead)' > weight(ahead) * value(me)
            extra = max(ahead.weight * me.value - ahead.dominant_share, 0.0) * capacity.get(gpu_type, 0)
            out.append(
                f"{me.unit.name} would move ahead of {ahead.unit.name} once {ahead.unit.name} uses about "
                f"{extra:,.0f} {gpu_type} GPU-hours more than {me.unit.name} from now on."
            )
        if ahead.value > 0 and me.value != float("inf"):
            weight = me.weight * me.value / ahead.value
            out.append(f"Or an admin raising {me.unit.name}'s weight from {me.weight:g} to above {weight:.2f} would.")
        else:
            out.append(f"{ahead.unit.name} has no recent use: it stays ahead until it uses some.")
    if me.place < len(level.siblings):
        behind = level.siblings[me.place]
        gpu_type = me.dominant_type or behind.dominant_type
        if gpu_type and me.weight > 0:
            extra = max(me.weight * behind.value - me.dominant_share, 0.0) * capacity.get(gpu_type, 0)
            out.append(
                f"{me.unit.name} keeps its place ahead of {behind.unit.name} until it uses about {extra:,.0f} "
                f"{gpu_type} GPU-hours more than {behind.unit.name} from now on."
            )
    out.append("Decay alone does not change this order: every unit's recent use halves at the same rate.")
    return out
