"""Fair share: usage decay and the order of teams (Slurm Fair Tree style, with DRF across GPU types).

At each level of the org tree, siblings are ordered by dominant usage / weight, lowest
first, and the order recurses into each subtree, so a team in a light department comes
before every team of a heavy one (Fair Tree). A unit's usage is the sum of its teams'
usage (jobs belong to teams only, so usage given on inner units is ignored), and across
GPU types the *dominant* share counts: usage of a type divided by the cluster's GPUs of
that type, the largest such fraction (Dominant Resource Fairness). CPU cores and memory count as two
more resources (``CPU``, ``MEMORY``: core-seconds over the cluster's cores, MiB-seconds over its
memory) where the nodes say theirs: a team that takes many cores for few GPUs pays for the cores. A job
that asks at most its GPUs' share of a node's cores and memory (the defaults) never makes them dominant.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from scheduling.core.types import QuotaUnit

# Usage and capacity keys beside the GPU types: CPU cores and memory (MiB).
CPU = "cpu"
MEMORY = "memory"
RESOURCES = (CPU, MEMORY)


def decay(usage: float, elapsed_s: float, half_life_s: float) -> float:
    """``usage`` after ``elapsed_s`` seconds of exponential decay with the given half-life."""
    if half_life_s <= 0:
        return 0.0
    return usage * math.pow(0.5, max(elapsed_s, 0.0) / half_life_s)


def accrue(usage: float, gpus: float, elapsed_s: float, half_life_s: float) -> float:
    """Decayed usage after holding ``gpus`` GPUs for ``elapsed_s`` seconds (exact integral of the decay)."""
    if half_life_s <= 0:
        return 0.0
    old = decay(usage, elapsed_s, half_life_s)
    rate = math.log(2) / half_life_s
    # integral over the interval of gpus * 2^(-(elapsed - t)/half_life) dt
    return old + gpus * (1.0 - math.pow(0.5, max(elapsed_s, 0.0) / half_life_s)) / rate


def dominant_share(usage: Mapping[str, float], capacity: Mapping[str, int]) -> float:
    """The largest fraction usage[type] / capacity[type] over types the cluster has."""
    share = 0.0
    for gpu_type, used in usage.items():
        cap = capacity.get(gpu_type, 0)
        if cap > 0:
            share = max(share, used / cap)
    return share


def team_order(units: Iterable[QuotaUnit], capacity: Mapping[str, int]) -> dict[str, int]:
    """Rank of every unit (teams included) in Fair Tree order: 0 goes first. Ties by name."""
    by_name = {u.name: u for u in units}
    children: dict[str | None, list[str]] = {}
    for u in by_name.values():
        parent = u.parent if u.parent in by_name else None
        children.setdefault(parent, []).append(u.name)

    totals: dict[str, dict[str, float]] = {}

    def total(name: str, seen: frozenset[str]) -> dict[str, float]:
        if name in totals:
            return totals[name]
        kids = [k for k in children.get(name, []) if k not in seen]
        if not kids:
            acc = dict(by_name[name].usage)
        else:
            acc = {}
            for k in kids:
                for t, v in total(k, seen | {k}).items():
                    acc[t] = acc.get(t, 0.0) + v
        totals[name] = acc
        return acc

    def level_value(name: str) -> float:
        weight = by_name[name].weight
        share = dominant_share(total(name, frozenset({name})), capacity)
        return share / weight if weight > 0 else math.inf

    rank: dict[str, int] = {}
    stack = [sorted(children.get(None, []), key=lambda n: (level_value(n), n), reverse=True)]
    # Iterative depth-first walk (no recursion limit on deep trees); a cycle in bad input is cut.
    while stack:
        top = stack[-1]
        if not top:
            stack.pop()
            continue
        name = top.pop()
        if name in rank:
            continue
        rank[name] = len(rank)
        kids = [k for k in children.get(name, []) if k not in rank]
        if kids:
            stack.append(sorted(kids, key=lambda n: (level_value(n), n), reverse=True))
    return rank
