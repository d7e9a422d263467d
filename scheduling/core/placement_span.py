"""Placement across nodes: one fabric domain, one leaf switch, the fewest leaves under one spine, the
fewest spines; and which nodes of the chosen leaves (or fabric domain) take the replicas, best fit.

Apart from ``placement`` (the entry point, which sends a gang here when no node holds it) and
``placement_node`` (one node's domains, whose GPU grouping the replicas here reuse).
"""

from __future__ import annotations

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE, NVLINK
from scheduling.core.placement_fit import Fit, Replica
from scheduling.core.placement_node import _take_grouped
from scheduling.core.types import Locality


def _multi_node(
    st: FreeState,
    gpu_type: str,
    replicas: int,
    per_replica: int,
    one_leaf: bool,
    room: dict[int, int] | None = None,
    one_fabric: bool = False,
) -> Fit | None:
    """``room``: node -> replicas it holds with their cores and memory (``_find_res``); None: GPUs decide."""
    ix = st.ix
    need = replicas * per_replica
    if st.fab_tfree:
        fit = _one_fabric(st, gpu_type, replicas, per_replica, room)
        if fit is not None or one_fabric:
            return fit
    elif one_fabric:
        return None
    if room is not None:
        by_leaf = [0] * len(ix.leaf_names)
        for ni, k in room.items():
            by_leaf[ix.nodes[ni].leaf] += k

        def leaf_cap(li: int) -> int:
            return by_leaf[li]
    else:

        def leaf_cap(li: int) -> int:
            return st.leaf_capacity(li, gpu_type, per_replica)

    # One leaf: the fitting leaf left with the fewest free GPUs. A leaf with fewer free GPUs than the
    # gang cannot hold it, so only the others are counted replica by replica (this runs for every
    # multi-node gang of a plan, over every leaf).
    leaf_best: tuple[int, int] | None = None
    for li, free in enumerate(st.leaf_tfree):
        key = (free.get(gpu_type, 0), li)
        if key[0] >= need and (leaf_best is None or key < leaf_best) and leaf_cap(li) >= replicas:
            leaf_best = key
    if leaf_best is not None:
        li = leaf_best[1]
        return _fit_from_leaves(st, gpu_type, per_replica, [(li, replicas)], Locality.LEAF, ix.leaf_names[li], room)
    if one_leaf:
        return None
    caps = [leaf_cap(li) if st.leaf_tfree[li].get(gpu_type, 0) >= per_replica else 0 for li in range(len(ix.leaf_names))]

    def leaf_key(li: int) -> tuple[int, int, int]:
        return (-caps[li], st.leaf_tfree[li].get(gpu_type, 0), li)

    # One spine: the fewest leaves, then best fit.
    spine_best: tuple[int, int, int] | None = None
    spine_pick: list[tuple[int, int]] = []
    for si, leaves in enumerate(ix.spine_leaves):
        if sum(caps[li] for li in leaves) < replicas:
            continue
        pick = _fewest(sorted(leaves, key=leaf_key), caps, replicas)
        spine_key = (len(pick), st.spine_tfree[si].get(gpu_type, 0), si)
        if spine_best is None or spine_key < spine_best:
            spine_best, spine_pick = spine_key, pick
    if spine_best is not None:
        si = spine_best[2]
        return _fit_from_leaves(st, gpu_type, per_replica, spine_pick, Locality.SPINE, ix.spine_names[si], room)

    # Several spines: the fewest spines, and inside each the fewest leaves.
    spine_caps = [sum(caps[li] for li in leaves) for leaves in ix.spine_leaves]
    if sum(spine_caps) < replicas:
        return None
    order = sorted(range(len(ix.spine_names)), key=lambda si: (-spine_caps[si], st.spine_tfree[si].get(gpu_type, 0), si))
    picks: list[tuple[int, int]] = []
    for si, count in _fewest(order, spine_caps, replicas):
        picks.extend(_fewest(sorted(ix.spine_leaves[si], key=leaf_key), caps, count))
    return _fit_from_leaves(st, gpu_type, per_replica, picks, Locality.CLUSTER, "cluster", room)


def _one_fabric(st: FreeState, gpu_type: str, replicas: int, per_replica: int, room: dict[int, int] | None) -> Fit | None:
    """The fitting fabric domain left with the fewest free GPUs (best fit), first in topology order.

    A fabric domain lies under one leaf (``index``), so such a fit is also one leaf's: whatever the leaf
    rule asks, it is met."""
    ix = st.ix
    need = replicas * per_replica
    best: tuple[int, int] | None = None
    for fi, free in enumerate(st.fab_tfree):
        key = (free.get(gpu_type, 0), fi)
        if key[0] < need or (best is not None and key >= best):
            continue
        cap = (
            sum(room.get(ni, 0) for ni in ix.fabric_nodes[fi])
            if room is not None
            else st.fabric_capacity(fi, gpu_type, per_replica)
        )
        if cap >= replicas:
            best = key
    if best is None:
        return None
    fi = best[1]
    reps = _fill_nodes(st, ix.fabric_nodes[fi], gpu_type, per_replica, replicas, room)
    reps.sort()
    return Fit(tuple(reps), Locality.FABRIC, ix.fabric_names[fi], 1, 1)


def _fewest(ordered: list[int], caps: list[int], need: int) -> list[tuple[int, int]]:
    """Fewest domains (given by descending capacity) holding ``need``; the last one chosen by best fit."""
    taken: list[tuple[int, int]] = []
    left = need
    for i, dom in enumerate(ordered):
        if caps[dom] >= left:
            # Best fit for the remainder: the smallest domain that still holds it.
            rest = [d for d in ordered[i:] if caps[d] >= left]
            last = min(rest, key=lambda d: (caps[d], ordered.index(d)))
            taken.append((last, left))
            return taken
        if caps[dom] > 0:
            taken.append((dom, caps[dom]))
            left -= caps[dom]
    return taken  # callers check the total first


def _fit_from_leaves(
    st: FreeState,
    gpu_type: str,
    per_replica: int,
    picks: list[tuple[int, int]],
    locality: Locality,
    domain: str,
    room: dict[int, int] | None = None,
) -> Fit:
    ix = st.ix
    reps: list[Replica] = []
    for li, count in picks:
        reps.extend(_fill_leaf(st, li, gpu_type, per_replica, count, room))
    reps.sort()
    leaves = {ix.nodes[ni].leaf for ni, _ in reps}
    spines = {ix.nodes[ni].spine for ni, _ in reps}
    return Fit(tuple(reps), locality, domain, len(leaves), len(spines))


def _fill_leaf(
    st: FreeState, li: int, gpu_type: str, per_replica: int, count: int, room: dict[int, int] | None = None
) -> list[Replica]:
    """``count`` replicas in leaf ``li``, on the nodes with the fewest free GPUs first (best fit);
    ``room``: at most that many replicas per node (their cores and memory), and only on those nodes."""
    return _fill_nodes(st, st.ix.leaf_nodes[li], gpu_type, per_replica, count, room)


def _fill_nodes(
    st: FreeState, among: list[int], gpu_type: str, per_replica: int, count: int, room: dict[int, int] | None = None
) -> list[Replica]:
    """``_fill_leaf`` over the nodes ``among`` (a leaf's, or a fabric domain's)."""
    ix = st.ix
    nfree = st.dfree[NODE]
    nodes = [
        ni
        for ni in among
        if nfree[ni] >= per_replica
        and ix.nodes[ni].gpu_type == gpu_type
        and ix.nodes[ni].schedulable
        and (room is None or room.get(ni, 0) > 0)
    ]
    nodes.sort(key=lambda ni: (nfree[ni], ni))
    out: list[Replica] = []
    for ni in nodes:
        row = st.free[ni]
        doms = ix.nodes[ni].doms[NVLINK]
        groups: dict[int, list[int]] = {}
        for p, is_free in enumerate(row):
            if is_free:
                groups.setdefault(doms[p], []).append(p)
        for _ in range(nfree[ni] // per_replica if room is None else room[ni]):
            if len(out) == count:
                return out
            chosen = sorted(_take_grouped(groups, per_replica))
            for g in list(groups):
                groups[g] = [p for p in groups[g] if p not in chosen]
            out.append((ni, tuple(chosen)))
        if len(out) == count:
            break
    return out
