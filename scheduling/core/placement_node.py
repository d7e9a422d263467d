"""Placement inside one node: the lowest domain (one NVLink domain, one PCIe switch, the node) that
holds the whole gang, best fit, and which GPUs of that domain it takes.

Apart from ``placement`` (the entry point, which picks between the searches) and ``placement_span``
(gangs across nodes, which take their GPUs inside each node as ``_take_grouped`` does here).
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE, NVLINK, PCIE
from scheduling.core.placement_fit import Fit
from scheduling.core.types import Locality

_LOCALITY = (Locality.NVLINK, Locality.PCIE, Locality.NODE)  # by level (index.NVLINK, PCIE, NODE)


def _single_node(st: FreeState, gpu_type: str, replicas: int, per_replica: int, max_node: int) -> Fit | None:
    need = replicas * per_replica
    for level in (NVLINK, PCIE, NODE):
        found = st.best_domain(gpu_type, level, need, max_node)
        if found is not None:
            return _domain_fit(st, level, found[0], found[1], replicas, per_replica)
    return None


def _single_node_buckets(
    st: FreeState, gpu_type: str, replicas: int, per_replica: int, max_node: int, cpus: int, memory_mb: int
) -> Fit | None:
    """``_single_node`` that passes over nodes short of cores or memory: the best-fit buckets in their
    order (lowest level, fewest free GPUs, then topology order), the first domain whose node has room."""
    assert st.buckets is not None
    ix = st.ix
    need = replicas * per_replica
    want_c, want_m = replicas * cpus, replicas * memory_mb
    cfree, mfree = st.cfree, st.mfree
    for level in (NVLINK, PCIE, NODE):
        dfree, dom_node = st.dfree[level], ix.dom_node[level]
        for k in range(need, max_node + 1):
            heap = st.buckets.get((gpu_type, level, k))
            if not heap:
                continue
            for d in sorted(set(heap)):
                ni = dom_node[d]
                if dfree[d] == k and cfree[ni] >= want_c and mfree[ni] >= want_m:
                    return _domain_fit(st, level, d, k, replicas, per_replica)
    return None


def _single_node_res(st: FreeState, gpu_type: str, replicas: int, per_replica: int, nodes: set[int]) -> Fit | None:
    """``_single_node`` over ``nodes`` only (those with the cores and memory): the lowest level, then
    the domain left with the fewest free GPUs, then topology order, as the buckets answer."""
    if not nodes:
        return None
    ix = st.ix
    need = replicas * per_replica
    for level in (NVLINK, PCIE, NODE):
        dfree = st.dfree[level]
        best: tuple[int, int] | None = None
        for ni in nodes:
            for d in set(ix.nodes[ni].doms[level]):
                k = dfree[d]
                if k >= need and (best is None or (k, d) < best):
                    best = (k, d)
        if best is not None:
            return _domain_fit(st, level, best[1], best[0], replicas, per_replica)
    return None


def _domain_fit(st: FreeState, level: int, d: int, k: int, replicas: int, per_replica: int) -> Fit:
    """The gang in domain ``d`` of ``level``, which has ``k`` free GPUs (at least the gang's)."""
    ix = st.ix
    ni = ix.dom_node[level][d]
    need = replicas * per_replica
    if k == need:
        # An exact fit takes every free GPU of the domain, which is what _pick_in_domain would
        # return (sorted), whatever sub-domains they sit in; best fit makes this the common case.
        row = st.free[ni]
        positions = [p for p in ix.dom_pos[level][d] if row[p]]
    else:
        positions = _pick_in_domain(st, ni, level, d, need)
    reps = tuple((ni, tuple(positions[i * per_replica : (i + 1) * per_replica])) for i in range(replicas))
    return Fit(reps, _LOCALITY[level], ix.nodes[ni].name, 1, 1)


def node_with_lent(st: FreeState, gpu_type: str, need: int, lent: Iterable[tuple[int, int]]) -> int | None:
    """The node of the domain ``_single_node`` would pick for one replica of ``need`` GPUs if the distinct
    busy GPUs ``lent`` were free, or None if it would pick none. Valid only when, as they are, no domain
    of ``gpu_type`` has ``need`` free GPUs: then only domains that gain lent GPUs can be picked, so only
    they are counted. Per level, lowest first, the fewest free GPUs >= need, then the first in topology
    order, as ``FreeState.best_domain`` picks.
    """
    ix = st.ix
    by_node: dict[int, list[int]] = {}
    for ni, p in lent:
        by_node.setdefault(ni, []).append(p)
    busy: dict[int, list[int]] = {}  # node -> the lent GPUs that lending would free there
    for ni, positions in by_node.items():
        node = ix.nodes[ni]
        if node.gpu_type == gpu_type and node.schedulable:  # elsewhere lending changes nothing of this type
            row = st.free[ni]
            if freed := [p for p in positions if not row[p]]:
                busy[ni] = freed
    for level in (NVLINK, PCIE, NODE):  # a level is counted only if the ones below it hold no candidate
        gained: dict[int, int] = {}
        for ni, positions in busy.items():
            doms = ix.nodes[ni].doms[level]
            for p in positions:
                gained[doms[p]] = gained.get(doms[p], 0) + 1
        dfree = st.dfree[level]
        best = min(((dfree[d] + n, d) for d, n in gained.items() if dfree[d] + n >= need), default=None)
        if best is not None:
            return ix.dom_node[level][best[1]]
    return None


def _pick_in_domain(st: FreeState, ni: int, level: int, d: int, need: int) -> list[int]:
    """``need`` free GPUs of domain ``d``, keeping to one sub-domain where one holds them."""
    ix = st.ix
    row = st.free[ni]
    free_pos = [p for p in ix.dom_pos[level][d] if row[p]]
    if level == PCIE:
        return free_pos[:need]
    # Inside an NVLink domain keep to one PCIe switch; inside a node, to the fewest NVLink domains.
    sub = PCIE if level == NVLINK else NVLINK
    doms = ix.nodes[ni].doms[sub]
    groups: dict[int, list[int]] = {}
    for p in free_pos:
        groups.setdefault(doms[p], []).append(p)
    return sorted(_take_grouped(groups, need))


def _take_grouped(groups: dict[int, list[int]], need: int) -> list[int]:
    fitting = [g for g in groups if len(groups[g]) >= need]
    if fitting:
        best = min(fitting, key=lambda g: (len(groups[g]), g))
        return groups[best][:need]
    out: list[int] = []
    for g in sorted(groups, key=lambda g: (-len(groups[g]), g)):
        out.extend(groups[g][: need - len(out)])
        if len(out) == need:
            break
    return out
