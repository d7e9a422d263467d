"""Topology-aware gang placement: the lowest domain that holds the whole gang, best fit.

Search order, lowest first: one NVLink domain, one PCIe switch, one node, one leaf
switch, the fewest leaves under one spine, the fewest spines. Among the candidates
of a level the one left with the fewest free GPUs wins (best fit), so that whole
nodes and whole leaves stay free for large gangs; ties go to topology order
(spine, leaf, node name), which packs the first leaves and keeps the last ones whole.
A replica never spans nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduling.core.index import NODE, NVLINK, PCIE, FreeState, TopoIndex
from scheduling.core.types import Config, Locality, PendingJob, Placement

Replica = tuple[int, tuple[int, ...]]  # (node index, GPU positions on that node)


@dataclass(frozen=True, slots=True)
class Fit:
    """A found placement, in index terms (node indexes, GPU positions)."""

    replicas: tuple[Replica, ...]  # rank order
    locality: Locality
    domain: str  # the smallest topology domain holding the gang ("n017", "leaf-3", "spine-1", "cluster")
    leaves: int
    spines: int

    def by_node(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for ni, positions in self.replicas:
            out.setdefault(ni, []).extend(positions)
        return out

    def gpu_ids(self, ix: TopoIndex) -> tuple[str, ...]:
        return tuple(ix.nodes[ni].gpu_ids[p] for ni, positions in self.replicas for p in positions)

    def placement(self, ix: TopoIndex, job_id: str, *, borrowed: bool) -> Placement:
        return Placement(
            job_id=job_id,
            replicas=tuple(tuple(ix.nodes[ni].gpu_ids[p] for p in pos) for ni, pos in self.replicas),
            nodes=tuple(ix.nodes[ni].name for ni, _ in self.replicas),
            locality=self.locality,
            leaves=self.leaves,
            spines=self.spines,
            borrowed=borrowed,
        )


def take_fit(st: FreeState, fit: Fit) -> None:
    for ni, positions in fit.by_node().items():
        st.take(ni, positions)


def find(st: FreeState, gpu_type: str, replicas: int, per_replica: int, *, one_leaf: bool = False) -> Fit | None:
    """The best placement of ``replicas`` x ``per_replica`` GPUs of ``gpu_type`` in ``st``, or None.

    ``one_leaf``: a gang that does not fit in one node fits only under one leaf switch, or not at all
    (see ``keep_in_leaf``).
    """
    ix = st.ix
    max_node = ix.type_max_node.get(gpu_type, 0)
    need = replicas * per_replica
    if per_replica <= 0 or replicas <= 0 or per_replica > max_node:
        return None
    if st.type_free.get(gpu_type, 0) < need:
        return None
    if need <= max_node:
        fit = _single_node(st, gpu_type, replicas, per_replica, max_node)
        if fit is not None:
            return fit
    if replicas > 1:
        return _multi_node(st, gpu_type, replicas, per_replica, one_leaf)
    return None


def keep_in_leaf(ix: TopoIndex, job: PendingJob, config: Config, now: float) -> bool:
    """Whether ``job`` may only be placed under one leaf switch (the leaf-locality rule).

    A multi-node gang that the READY nodes of one leaf could hold waits for such a leaf rather than
    span leaves: its all-reduce would otherwise cross the spine for its whole run, which costs more
    than the wait. ``Config.leaf_wait_s`` bounds the wait (since submit); inf keeps it strict.
    """
    if job.replicas <= 1 or job.replicas > ix.leaf_replicas_capacity(job.gpu_type, job.gpus_per_replica):
        return False
    return now - job.submit_time < config.leaf_wait_s


# --------------------------------------------------------------------------- one node


def _single_node(st: FreeState, gpu_type: str, replicas: int, per_replica: int, max_node: int) -> Fit | None:
    ix = st.ix
    need = replicas * per_replica
    for level in (NVLINK, PCIE, NODE):
        found = st.best_domain(gpu_type, level, need, max_node)
        if found is None:
            continue
        d = found[0]
        ni = ix.dom_node[level][d]
        positions = _pick_in_domain(st, ni, level, d, need)
        reps = tuple((ni, tuple(positions[i * per_replica : (i + 1) * per_replica])) for i in range(replicas))
        return Fit(reps, Locality(level), ix.nodes[ni].name, 1, 1)
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


# --------------------------------------------------------------------------- several nodes


def _multi_node(st: FreeState, gpu_type: str, replicas: int, per_replica: int, one_leaf: bool) -> Fit | None:
    ix = st.ix
    need = replicas * per_replica
    # One leaf: the fitting leaf left with the fewest free GPUs. A leaf with fewer free GPUs than the
    # gang cannot hold it, so only the others are counted replica by replica (this runs for every
    # multi-node gang of a plan, over every leaf).
    leaf_best: tuple[int, int] | None = None
    for li, free in enumerate(st.leaf_tfree):
        key = (free.get(gpu_type, 0), li)
        if key[0] >= need and (leaf_best is None or key < leaf_best) and st.leaf_capacity(li, gpu_type, per_replica) >= replicas:
            leaf_best = key
    if leaf_best is not None:
        li = leaf_best[1]
        return _fit_from_leaves(st, gpu_type, per_replica, [(li, replicas)], Locality.LEAF, ix.leaf_names[li])
    if one_leaf:
        return None
    caps = [
        st.leaf_capacity(li, gpu_type, per_replica) if st.leaf_tfree[li].get(gpu_type, 0) >= per_replica else 0
        for li in range(len(ix.leaf_names))
    ]

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
        return _fit_from_leaves(st, gpu_type, per_replica, spine_pick, Locality.SPINE, ix.spine_names[si])

    # Several spines: the fewest spines, and inside each the fewest leaves.
    spine_caps = [sum(caps[li] for li in leaves) for leaves in ix.spine_leaves]
    if sum(spine_caps) < replicas:
        return None
    order = sorted(range(len(ix.spine_names)), key=lambda si: (-spine_caps[si], st.spine_tfree[si].get(gpu_type, 0), si))
    picks: list[tuple[int, int]] = []
    for si, count in _fewest(order, spine_caps, replicas):
        picks.extend(_fewest(sorted(ix.spine_leaves[si], key=leaf_key), caps, count))
    return _fit_from_leaves(st, gpu_type, per_replica, picks, Locality.CLUSTER, "cluster")


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
    st: FreeState, gpu_type: str, per_replica: int, picks: list[tuple[int, int]], locality: Locality, domain: str
) -> Fit:
    ix = st.ix
    reps: list[Replica] = []
    for li, count in picks:
        reps.extend(_fill_leaf(st, li, gpu_type, per_replica, count))
    reps.sort()
    leaves = {ix.nodes[ni].leaf for ni, _ in reps}
    spines = {ix.nodes[ni].spine for ni, _ in reps}
    return Fit(tuple(reps), locality, domain, len(leaves), len(spines))


def _fill_leaf(st: FreeState, li: int, gpu_type: str, per_replica: int, count: int) -> list[Replica]:
    """``count`` replicas in leaf ``li``, on the nodes with the fewest free GPUs first (best fit)."""
    ix = st.ix
    nfree = st.dfree[NODE]
    nodes = [
        ni
        for ni in ix.leaf_nodes[li]
        if nfree[ni] >= per_replica and ix.nodes[ni].gpu_type == gpu_type and ix.nodes[ni].schedulable
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
        for _ in range(nfree[ni] // per_replica):
            if len(out) == count:
                return out
            chosen = sorted(_take_grouped(groups, per_replica))
            for g in list(groups):
                groups[g] = [p for p in groups[g] if p not in chosen]
            out.append((ni, tuple(chosen)))
        if len(out) == count:
            break
    return out
