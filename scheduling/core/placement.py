"""Topology-aware gang placement: the lowest domain that holds the whole gang, best fit.

Search order, lowest first: one NVLink domain, one PCIe switch, one node, one fabric
domain (a multi-node NVLink domain, ``Node.fabric``), one leaf switch, the fewest leaves
under one spine, the fewest spines. ``one_fabric`` stops after the fabric domain. Among the candidates
of a level the one left with the fewest free GPUs wins (best fit), so that whole
nodes and whole leaves stay free for large gangs; ties go to topology order
(spine, leaf, node name), which packs the first leaves and keeps the last ones whole.
A replica never spans nodes.

A replica also needs its CPU cores and memory free on its node (``FreeState``). While the GPU-only
search is exact for the job (``FreeState.exact_for``: it asks at most every node's share per GPU and no
node of its type is skewed), that search runs as it is; otherwise the same order is searched over the
nodes that hold the job's cores and memory too (``_single_node_res``, ``_multi_node`` with room).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from scheduling.core.index import NODE, NVLINK, PCIE, FreeState, TopoIndex
from scheduling.core.types import Config, LeafLocality, Locality, PendingJob, Placement

Replica = tuple[int, tuple[int, ...]]  # (node index, GPU positions on that node)
_LOCALITY = (Locality.NVLINK, Locality.PCIE, Locality.NODE)  # by level (index.NVLINK, PCIE, NODE)


class Fit(NamedTuple):
    """A found placement, in index terms (node indexes, GPU positions).

    A NamedTuple, not a frozen dataclass: one is built for every search that succeeds (thousands
    per plan), and frozen dataclasses are several times slower to construct."""

    replicas: tuple[Replica, ...]  # rank order
    locality: Locality
    domain: str  # the smallest topology domain holding the gang ("n017", a fabric domain, "leaf-3", "spine-1", "cluster")
    leaves: int
    spines: int

    def by_node(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for ni, positions in self.replicas:
            out.setdefault(ni, []).extend(positions)
        return out

    def gpu_ids(self, ix: TopoIndex) -> tuple[str, ...]:
        return tuple(ix.nodes[ni].gpu_ids[p] for ni, positions in self.replicas for p in positions)

    def placement(self, ix: TopoIndex, job_id: str, *, borrowed: bool, at_risk: bool = False) -> Placement:
        nodes = ix.nodes
        return Placement(
            job_id=job_id,
            replicas=tuple(tuple([nodes[ni].gpu_ids[p] for p in pos]) for ni, pos in self.replicas),
            nodes=tuple([nodes[ni].name for ni, _ in self.replicas]),
            locality=self.locality,
            leaves=self.leaves,
            spines=self.spines,
            borrowed=borrowed,
            at_risk=at_risk,
        )


def take_fit(st: FreeState, fit: Fit, cpus: int = 0, memory_mb: int = 0) -> None:
    """Take a fit's GPUs, each replica's ``cpus`` cores and ``memory_mb`` with them."""
    if st.ix.limited:
        for ni, replica in fit.replicas:
            st.carry(ni, replica, cpus, memory_mb)
    if len(fit.replicas) == 1:  # most placements: one replica, one node, nothing to group
        st.take(*fit.replicas[0])
        return
    for ni, positions in fit.by_node().items():
        st.take(ni, positions)


def find(
    st: FreeState,
    gpu_type: str,
    replicas: int,
    per_replica: int,
    *,
    one_leaf: bool = False,
    cpus: int = 0,
    memory_mb: int = 0,
    one_fabric: bool = False,
    one_per_node: bool = False,
) -> Fit | None:
    """The best placement of ``replicas`` x ``per_replica`` GPUs of ``gpu_type`` in ``st``, or None;
    each replica with ``cpus`` cores and ``memory_mb`` MiB free on its node.

    ``one_leaf``: a gang that does not fit in one node fits only under one leaf switch, or not at all
    (see ``keep_in_leaf``). ``one_fabric``: it fits only inside one fabric domain (``PendingJob.one_fabric``).
    ``one_per_node``: each replica on a node of its own (``PendingJob.one_per_node``).
    """
    ix = st.ix
    max_node = ix.type_max_node.get(gpu_type, 0)
    need = replicas * per_replica
    if per_replica <= 0 or replicas <= 0 or per_replica > max_node:
        return None
    if st.type_free.get(gpu_type, 0) < need:
        return None
    if one_per_node and replicas > 1:
        # The search over nodes with room, each node counted for one replica at most.
        room = dict.fromkeys(_room(st, gpu_type, per_replica, cpus, memory_mb), 1)
        if len(room) < replicas:
            return None
        return _multi_node(st, gpu_type, replicas, per_replica, one_leaf, room, one_fabric)
    if not st.ix.light(gpu_type, per_replica, cpus, memory_mb):
        return _find_res(st, gpu_type, replicas, per_replica, one_leaf, cpus, memory_mb, one_fabric)
    # A job that asks at most its GPUs' share: where GPUs do not fit, nothing does; where they do on
    # nodes that also have its cores and memory (always, unless some node is skewed), the GPU-only
    # answer is the best among the nodes with room too. Only a fit on a skewed node short of them
    # sends the job to the search over nodes with room.
    fit = _gpus_only(st, gpu_type, replicas, per_replica, max_node, one_leaf, one_fabric)
    if fit is not None and not st.exact_for(gpu_type, per_replica, cpus, memory_mb) and not _has_room(st, fit, cpus, memory_mb):
        return _find_res(st, gpu_type, replicas, per_replica, one_leaf, cpus, memory_mb, one_fabric)
    return fit


def find_job(st: FreeState, job: PendingJob, *, one_leaf: bool = False) -> Fit | None:
    """``find`` for a pending job: its GPUs, its cores and memory per replica, its fabric rule."""
    return find(
        st,
        job.gpu_type,
        job.replicas,
        job.gpus_per_replica,
        one_leaf=one_leaf,
        cpus=job.cpus_per_replica,
        memory_mb=job.memory_mb_per_replica,
        one_fabric=job.one_fabric,
        one_per_node=job.one_per_node,
    )


def _gpus_only(
    st: FreeState, gpu_type: str, replicas: int, per_replica: int, max_node: int, one_leaf: bool, one_fabric: bool
) -> Fit | None:
    if replicas * per_replica <= max_node:
        fit = _single_node(st, gpu_type, replicas, per_replica, max_node)
        if fit is not None:
            return fit
    if replicas > 1:
        return _multi_node(st, gpu_type, replicas, per_replica, one_leaf, None, one_fabric)
    return None


def _has_room(st: FreeState, fit: Fit, cpus: int, memory_mb: int) -> bool:
    """Whether every node of ``fit`` has the cores and memory of the replicas it would take."""
    count: dict[int, int] = {}
    for ni, _ in fit.replicas:
        count[ni] = count.get(ni, 0) + 1
    return all(st.cfree[ni] >= k * cpus and st.mfree[ni] >= k * memory_mb for ni, k in count.items())


def _find_res(
    st: FreeState,
    gpu_type: str,
    replicas: int,
    per_replica: int,
    one_leaf: bool,
    cpus: int,
    memory_mb: int,
    one_fabric: bool = False,
) -> Fit | None:
    """``find`` where cores or memory may be short: the same order, over the nodes that hold them."""
    ix = st.ix
    max_node = ix.type_max_node.get(gpu_type, 0)
    if replicas * per_replica <= max_node:
        if st.buckets is not None:
            fit = _single_node_buckets(st, gpu_type, replicas, per_replica, max_node, cpus, memory_mb)
        else:
            roomy = {ni for ni, k in _room(st, gpu_type, per_replica, cpus, memory_mb).items() if k >= replicas}
            fit = _single_node_res(st, gpu_type, replicas, per_replica, roomy)
        if fit is not None:
            return fit
    if replicas > 1:
        room = _room(st, gpu_type, per_replica, cpus, memory_mb)
        if sum(room.values()) < replicas:
            return None
        return _multi_node(st, gpu_type, replicas, per_replica, one_leaf, room, one_fabric)
    return None


def _room(st: FreeState, gpu_type: str, per_replica: int, cpus: int, memory_mb: int) -> dict[int, int]:
    """Node -> how many replicas of ``per_replica`` GPUs, ``cpus`` cores and ``memory_mb`` it holds now
    (nodes that hold none left out): one pass over the type's nodes, inlined (``FreeState.room``)."""
    nfree, cfree, mfree = st.dfree[NODE], st.cfree, st.mfree
    out: dict[int, int] = {}
    for ni in st.ix.type_nodes.get(gpu_type, ()):
        k = nfree[ni] // per_replica
        if k <= 0:
            continue
        if cpus > 0 and cfree[ni] < k * cpus:
            k = cfree[ni] // cpus
        if memory_mb > 0 and mfree[ni] < k * memory_mb:
            k = mfree[ni] // memory_mb
        if k > 0:
            out[ni] = k
    return out


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


def keep_in_leaf(ix: TopoIndex, job: PendingJob, config: Config, now: float) -> bool:
    """Whether ``job`` is searched under one leaf switch only (the leaf-locality rule).

    A multi-node gang that the READY nodes of one leaf could hold runs slower across leaves (its
    all-reduce crosses the spine for its whole run). ``required`` keeps it to one leaf; ``preferred``
    never does (the search still tries one leaf first); ``auto`` does unless spanning is set to cost
    nothing (``Config.span_slowdown`` 0), and ``locality.LeafChooser`` then lets it span when that
    costs less than the wait. ``Config.leaf_wait_s`` bounds any wait (since submit).
    """
    if job.replicas <= 1 or job.replicas > ix.leaf_replicas_capacity(job.gpu_type, job.gpus_per_replica):
        return False
    if now - job.submit_time >= config.leaf_wait_s or job.locality == LeafLocality.PREFERRED:
        return False
    return job.locality == LeafLocality.REQUIRED or config.span_slowdown > 0


# --------------------------------------------------------------------------- one node


def _single_node(st: FreeState, gpu_type: str, replicas: int, per_replica: int, max_node: int) -> Fit | None:
    need = replicas * per_replica
    for level in (NVLINK, PCIE, NODE):
        found = st.best_domain(gpu_type, level, need, max_node)
        if found is not None:
            return _domain_fit(st, level, found[0], found[1], replicas, per_replica)
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


# --------------------------------------------------------------------------- several nodes


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
