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

This module is the entry point: ``find`` and ``find_job``, the choice between the GPU-only search and
the search over nodes with room, and the leaf rule (``keep_in_leaf``). The searches live apart:
``placement_node`` inside one node, ``placement_span`` across nodes; the ``Fit`` they return, and
``take_fit``, in ``placement_fit``.
"""

from __future__ import annotations

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE, TopoIndex
from scheduling.core.placement_fit import Fit

# ``_single_node`` is looked up here, not in ``placement_node``, so that the tests that swap the fast
# path for its plainer twin (``tests/property/test_fast_paths.py``) swap it for every search.
from scheduling.core.placement_node import _single_node, _single_node_buckets, _single_node_res
from scheduling.core.placement_span import _multi_node
from scheduling.core.types import Config, LeafLocality, PendingJob


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
    allowed: frozenset[int] | None = None,
) -> Fit | None:
    """The best placement of ``replicas`` x ``per_replica`` GPUs of ``gpu_type`` in ``st``, or None;
    each replica with ``cpus`` cores and ``memory_mb`` MiB free on its node.

    ``one_leaf``: a gang that does not fit in one node fits only under one leaf switch, or not at all
    (see ``keep_in_leaf``). ``one_fabric``: it fits only inside one fabric domain (``PendingJob.one_fabric``).
    ``one_per_node``: each replica on a node of its own (``PendingJob.one_per_node``). ``allowed``: only
    these nodes may take a replica (those with the capabilities the job needs, ``TopoIndex.allowed_for``);
    None: any.
    """
    ix = st.ix
    max_node = ix.type_max_node.get(gpu_type, 0)
    need = replicas * per_replica
    if per_replica <= 0 or replicas <= 0 or per_replica > max_node:
        return None
    if st.type_free.get(gpu_type, 0) < need:
        return None
    if allowed is not None:
        return _find_among(st, gpu_type, replicas, per_replica, one_leaf, cpus, memory_mb, one_fabric, one_per_node, allowed)
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
        allowed=st.ix.allowed_for(job.needs),
    )


def _find_among(
    st: FreeState,
    gpu_type: str,
    replicas: int,
    per_replica: int,
    one_leaf: bool,
    cpus: int,
    memory_mb: int,
    one_fabric: bool,
    one_per_node: bool,
    allowed: frozenset[int],
) -> Fit | None:
    """``find`` over the ``allowed`` nodes only: the search over nodes with room (``_find_res``), the
    others given none. The same order and best fit, so a job whose every node is allowed is placed
    where the GPU-only search would place it."""
    room = {ni: k for ni, k in _room(st, gpu_type, per_replica, cpus, memory_mb).items() if ni in allowed}
    if one_per_node and replicas > 1:
        room = dict.fromkeys(room, 1)
    if sum(room.values()) < replicas:
        return None
    if replicas * per_replica <= st.ix.type_max_node.get(gpu_type, 0) and not (one_per_node and replicas > 1):
        fit = _single_node_res(st, gpu_type, replicas, per_replica, {ni for ni, k in room.items() if k >= replicas})
        if fit is not None:
            return fit
    if replicas > 1:
        return _multi_node(st, gpu_type, replicas, per_replica, one_leaf, room, one_fabric)
    return None


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
