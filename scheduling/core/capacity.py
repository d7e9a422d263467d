"""The admission check's fast path: can a job of this shape ever run here, under these quotas?

``admission.admit`` answers that (and where or when the job would start) from a whole snapshot and a
plan; a submission at CI rates cannot afford either. Whether a job can *ever* run depends only on the
shape of the cluster (how many healthy GPUs of each type, on which nodes) and on the quota tree, so
``Capacity`` keeps just that — built once from a Topology and reused until the cluster changes — and
``refusal`` gives the same verdict as ``admit`` for any job (tests/property/test_capacity.py compares
them on random states).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.core.index import UNLIMITED
from scheduling.core.reasons import never_resources
from scheduling.core.types import PendingJob, QuotaUnit, Tier, Topology


@dataclass(frozen=True, slots=True)
class Capacity:
    """Per GPU type: the GPU count of each node (any state: a drained node comes back), and each node's
    (GPUs, cores, memory) where any node says its cores or memory (``index.UNLIMITED`` where not)."""

    nodes: Mapping[str, tuple[int, ...]]
    sizes: Mapping[str, tuple[tuple[int, int, int], ...]] | None = None
    # Per GPU type, the GPU count of each node of each fabric domain (``index``'s rule: only the nodes
    # under the leaf of its first node), for one-fabric jobs; empty without fabric domains.
    fabrics: Mapping[str, tuple[tuple[int, ...], ...]] | None = None

    @property
    def types(self) -> list[str]:
        return sorted(t for t, sizes in self.nodes.items() if sum(sizes))


def capacity_of(topology: Topology) -> Capacity:
    sizes: dict[str, list[int]] = {}
    full: dict[str, list[tuple[int, int, int]]] = {}
    for node in topology.nodes:
        sizes.setdefault(node.gpu_type, []).append(len(node.gpus))
        full.setdefault(node.gpu_type, []).append(
            (len(node.gpus), node.cpus if node.cpus > 0 else UNLIMITED, node.memory_mb if node.memory_mb > 0 else UNLIMITED)
        )
    limited = any(n.cpus > 0 or n.memory_mb > 0 for n in topology.nodes)
    fabric_leaf: dict[str, str] = {}
    members: dict[str, dict[str, list[int]]] = {}  # type -> fabric -> node sizes
    for node in sorted(topology.nodes, key=lambda n: (n.spine, n.leaf, n.name)):
        if node.fabric and fabric_leaf.setdefault(node.fabric, node.leaf) == node.leaf:
            members.setdefault(node.gpu_type, {}).setdefault(node.fabric, []).append(len(node.gpus))
    return Capacity(
        nodes={t: tuple(sorted(s, reverse=True)) for t, s in sizes.items()},
        sizes={t: tuple(s) for t, s in full.items()} if limited else None,
        fabrics={t: tuple(tuple(f[name]) for name in sorted(f)) for t, f in members.items()} if fabric_leaf else None,
    )


def refusal(capacity: Capacity, quotas: Iterable[QuotaUnit], job: PendingJob) -> str | None:
    """Why ``job`` can never run, word for word as ``admit`` says it; None when it can."""
    if job.replicas <= 0 or job.gpus_per_replica <= 0:
        return "a job needs at least one replica of at least one GPU"
    t, r, g = job.gpu_type, job.replicas, job.gpus_per_replica
    sizes = capacity.nodes.get(t, ())
    total = sum(sizes)
    if total == 0:
        return f"the cluster has no {t} GPUs (it has: {', '.join(capacity.types) or 'none'})"
    largest = max(sizes)
    if g > largest:
        return (
            f"a replica needs {g} {t} on one node, but the largest {t} node has {largest}; "
            f"split it into more replicas of at most {largest}"
        )
    if r * g > total:
        return f"needs {r * g} {t}, the whole cluster has {total}"
    cap = sum(n // g for n in sizes)
    if r > cap:
        return f"needs {r} replicas of {g} {t}; the cluster's nodes hold at most {cap}"
    if job.spread and r > sum(1 for n in sizes if n >= g):
        return f"needs {r} nodes with {g} {t} each (one replica per node); the cluster has {sum(1 for n in sizes if n >= g)}"
    if job.one_fabric and r * g > largest:
        fabrics = (capacity.fabrics or {}).get(t, ())
        most = max((sum(n // g for n in f) for f in fabrics), default=0)
        if r > most:
            if capacity.fabrics is None:
                return f"needs one NVLink fabric domain for {r} replicas of {g} {t}; the cluster has none"
            return f"needs {r} replicas of {g} {t} inside one NVLink fabric domain; the largest domain holds {most}"
    if capacity.sizes is not None and (job.cpus_per_replica > 0 or job.memory_mb_per_replica > 0):
        short = never_resources(capacity.sizes.get(t, ()), t, r, g, job.cpus_per_replica, job.memory_mb_per_replica)
        if short is not None:
            return short
    return quota_refusal(quotas, job)


def quota_refusal(quotas: Iterable[QuotaUnit], job: PendingJob) -> str | None:
    """Why the quota tree can never let ``job`` run (no such team, a Tier 1 job above its team's guarantee,
    a job above a limit up the chain), or None: the quota half of ``refusal`` and of ``admission.admit``."""
    t = job.gpu_type
    units = {u.name: u for u in quotas}
    if job.team not in units:
        return f"team {job.team} is not in the quota tree"
    n = job.gpu_count
    if job.tier == Tier.PRODUCTION:
        guaranteed = units[job.team].guaranteed.get(t, 0)
        if n > guaranteed:
            return f"Tier 1 runs only within guarantee: team {job.team} has {guaranteed} guaranteed {t}, the job needs {n}"
    name: str | None = job.team
    seen: set[str] = set()
    while name is not None and name in units and name not in seen:
        seen.add(name)
        limit = units[name].limit.get(t)
        if limit is not None and n > limit:
            who = "team" if name == job.team else "unit"
            return f"needs {n} {t}, above the {who} {name}'s limit of {limit}"
        name = units[name].parent
    return None
