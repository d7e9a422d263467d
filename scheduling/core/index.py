"""Topology indexes and the free-GPU state that placement searches.

``TopoIndex`` is built once per ``Topology`` object (cached on object identity:
the simulator and the Celery cycle pass the same object while nodes do not
change, and hashing the whole tuple every cycle would cost more than planning).

``FreeState`` holds, for one plan, which GPUs are free, as integer counts per
NVLink domain, PCIe switch, node, fabric domain, leaf and spine, plus buckets "domains of this
GPU type with exactly k free GPUs", so that a best-fit search is a few bucket
lookups instead of a scan of the cluster.

Fabric domains (multi-node NVLink domains, ``Node.fabric``) are assumed to lie under one leaf switch
(on GB200 NVL72 one rack is one NVLink domain and one leaf). A node whose fabric domain's other nodes
are under another leaf is taken as in no fabric domain (the domain keeps the leaf of its first node in
topology order): a placement "in one fabric domain" is then also in one leaf, which the counted fast
paths of backfill and reclaim rely on. A cluster without fabric domains keeps no fabric counts at all.

CPU cores and memory: a node that reports them (``Node.cpus``/``memory_mb``) is held to them. Each
busy GPU carries the cores and memory its replica was given (spread over the replica's GPUs), so
whatever frees a GPU (a job's end in a replay, a victim lent for a trial) frees them with it, and
taking it back takes them again. A node is *skewed* when it has fewer free cores (or memory) than its
share for its free GPUs (cores x free GPUs / GPUs): some job took more than its GPUs' share. While no
node of a type is skewed, a job that asks at most each node's share per GPU fits wherever its GPUs fit,
and the GPU-only search is exact; otherwise ``placement`` checks every candidate node.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.core.types import Topology

# Domain levels inside a node; the values match Locality.NVLINK/PCIE/NODE.
NVLINK, PCIE, NODE = 0, 1, 2
LEVELS = (NVLINK, PCIE, NODE)
UNLIMITED = 1 << 48  # the cores or memory of a node that does not report them: never the one short

Loc = tuple[int, int]  # (node index, GPU position)


def spread(amount: int, n: int) -> list[int]:
    """``amount`` over ``n`` GPUs as evenly as integers go (the first ones take the remainder)."""
    if n <= 0:
        return []
    base, extra = divmod(amount, n)
    return [base + 1 if i < extra else base for i in range(n)]


@dataclass(frozen=True, slots=True)
class NodeIx:
    name: str
    leaf: int
    spine: int
    gpu_type: str
    schedulable: bool
    gpu_ids: tuple[str, ...]  # by position (GPU index order)
    doms: tuple[tuple[int, ...], ...]  # per level: the global domain index of each position
    fabric: int = -1  # its fabric domain's index (``TopoIndex.fabric_names``); -1: none


def carried(
    out: dict[Loc, tuple[int, int]],
    gpu_loc: Mapping[str, Loc],
    replicas: Iterable[Iterable[str]],
    cpus: int,
    memory_mb: int,
) -> None:
    """Add to ``out`` what each GPU of a job's replicas carries (``FreeState``'s ``held``)."""
    if cpus <= 0 and memory_mb <= 0:
        return
    for replica in replicas:
        locs = [gpu_loc[g] for g in replica if g in gpu_loc]
        for loc, c, m in zip(locs, spread(cpus, len(locs)), spread(memory_mb, len(locs)), strict=True):
            out[loc] = (c, m)


class TopoIndex:
    """Static facts about one Topology, in a fixed order (spine, leaf, node name)."""

    def __init__(self, topology: Topology) -> None:
        nodes = sorted(topology.nodes, key=lambda n: (n.spine, n.leaf, n.name))
        self.spine_names: list[str] = sorted({n.spine for n in nodes})
        spine_ix = {s: i for i, s in enumerate(self.spine_names)}
        # A leaf belongs to one spine; if the input disagrees, the smallest name wins, deterministically.
        spine_of: dict[str, str] = {}
        for n in nodes:
            spine_of[n.leaf] = min(spine_of.get(n.leaf, n.spine), n.spine)
        self.leaf_names: list[str] = sorted(spine_of, key=lambda lf: (spine_of[lf], lf))
        leaf_ix = {lf: i for i, lf in enumerate(self.leaf_names)}
        self.leaf_spine: list[int] = [spine_ix[spine_of[lf]] for lf in self.leaf_names]
        self.spine_leaves: list[list[int]] = [[] for _ in self.spine_names]
        for li, si in enumerate(self.leaf_spine):
            self.spine_leaves[si].append(li)
        self.leaf_nodes: list[list[int]] = [[] for _ in self.leaf_names]
        # Fabric domains in topology order (by the leaf and name of their first node); one leaf each.
        fabric_leaf: dict[str, str] = {}
        for n in nodes:
            if n.fabric:
                fabric_leaf.setdefault(n.fabric, n.leaf)
        self.fabric_names: list[str] = sorted(fabric_leaf, key=lambda f: (leaf_ix[fabric_leaf[f]], f))
        fabric_ix = {f: i for i, f in enumerate(self.fabric_names)}
        self.fabric_leaf: list[int] = [leaf_ix[fabric_leaf[f]] for f in self.fabric_names]
        self.fabric_nodes: list[list[int]] = [[] for _ in self.fabric_names]

        # Per level: the node and the positions of each domain, and a display name.
        self.dom_node: list[list[int]] = [[], [], []]
        self.dom_pos: list[list[tuple[int, ...]]] = [[], [], []]
        self.dom_name: list[list[str]] = [[], [], []]
        self.nodes: list[NodeIx] = []
        self.gpu_loc: dict[str, tuple[int, int]] = {}
        self.type_total: dict[str, int] = {}
        self.type_max_node: dict[str, int] = {}  # largest node of the type (any state)
        self.max_node_size = 0
        for ni, node in enumerate(nodes):
            gpus = sorted(node.gpus, key=lambda g: (g.index, g.id))
            doms: list[tuple[int, ...]] = []
            for level, key in ((NVLINK, "nvlink"), (PCIE, "pcie")):
                local: dict[str, int] = {}
                per_pos: list[int] = []
                for pos, g in enumerate(gpus):
                    dom_id: str = getattr(g, key)
                    if dom_id not in local:
                        local[dom_id] = len(self.dom_node[level])
                        self.dom_node[level].append(ni)
                        self.dom_pos[level].append(())
                        self.dom_name[level].append(dom_id)
                    d = local[dom_id]
                    self.dom_pos[level][d] = (*self.dom_pos[level][d], pos)
                    per_pos.append(d)
                doms.append(tuple(per_pos))
            self.dom_node[NODE].append(ni)
            self.dom_pos[NODE].append(tuple(range(len(gpus))))
            self.dom_name[NODE].append(node.name)
            doms.append(tuple(ni for _ in gpus))
            li = leaf_ix[node.leaf]
            self.leaf_nodes[li].append(ni)
            fi = fabric_ix[node.fabric] if node.fabric and fabric_leaf[node.fabric] == node.leaf else -1
            if fi >= 0:
                self.fabric_nodes[fi].append(ni)
            self.nodes.append(
                NodeIx(
                    name=node.name,
                    leaf=li,
                    spine=self.leaf_spine[li],
                    gpu_type=node.gpu_type,
                    schedulable=node.schedulable,
                    gpu_ids=tuple(g.id for g in gpus),
                    doms=tuple(doms),
                    fabric=fi,
                )
            )
            for pos, g in enumerate(gpus):
                self.gpu_loc[g.id] = (ni, pos)
            self.type_total[node.gpu_type] = self.type_total.get(node.gpu_type, 0) + len(gpus)
            self.type_max_node[node.gpu_type] = max(self.type_max_node.get(node.gpu_type, 0), len(gpus))
            self.max_node_size = max(self.max_node_size, len(gpus))
        self.gpu_types: list[str] = sorted(self.type_total)
        # CPU cores and memory: what each node may give (UNLIMITED where it does not say), each node's GPUs'
        # place in flat per-GPU lists, and per type the smallest share per GPU of any node (``light``).
        self.ncpu: list[int] = [n.cpus if n.cpus > 0 else UNLIMITED for n in nodes]
        self.nmem: list[int] = [n.memory_mb if n.memory_mb > 0 else UNLIMITED for n in nodes]
        self.limited = any(c < UNLIMITED for c in self.ncpu) or any(m < UNLIMITED for m in self.nmem)
        self.off: list[int] = []
        total = 0
        for node_ix in self.nodes:
            self.off.append(total)
            total += len(node_ix.gpu_ids)
        self.gpu_slots = total
        self.type_nodes: dict[str, list[int]] = {}
        self.cpu_share: dict[str, float] = {}  # type -> min over its nodes of cores per GPU
        self.mem_share: dict[str, float] = {}
        self.type_max_cpu: dict[str, int] = {}  # type -> the most cores one node of it may give
        self.type_max_mem: dict[str, int] = {}
        for ni, node_ix in enumerate(self.nodes):
            t, count = node_ix.gpu_type, len(node_ix.gpu_ids)
            self.type_nodes.setdefault(t, []).append(ni)
            self.type_max_cpu[t] = max(self.type_max_cpu.get(t, 0), self.ncpu[ni])
            self.type_max_mem[t] = max(self.type_max_mem.get(t, 0), self.nmem[ni])
            if count:
                self.cpu_share[t] = min(self.cpu_share.get(t, float(UNLIMITED)), self.ncpu[ni] / count)
                self.mem_share[t] = min(self.mem_share.get(t, float(UNLIMITED)), self.nmem[ni] / count)
        # Per type: how many replicas of G GPUs the whole cluster could ever hold (admission).
        self._shape_cap: dict[tuple[str, int], int] = {}
        self._leaf_cap: dict[tuple[str, int], int] = {}
        self._fabric_cap: dict[tuple[str, int], int] = {}

    def share_capacity(self) -> dict[str, int]:
        """What fair share divides usage by (``fairshare.dominant_share``): GPUs per type, and the cores
        and memory of the nodes that say theirs."""
        out = dict(self.type_total)
        if self.limited:
            out["cpu"] = sum(c for c in self.ncpu if c < UNLIMITED)
            out["memory"] = sum(m for m in self.nmem if m < UNLIMITED)
        return out

    def light(self, gpu_type: str, per_replica: int, cpus: int, memory_mb: int) -> bool:
        """Whether a replica of ``per_replica`` GPUs asking ``cpus`` cores and ``memory_mb`` asks at most
        every node of the type's share for its GPUs (then only skewed nodes can be short of them)."""
        if not self.limited or (cpus <= 0 and memory_mb <= 0):
            return True
        cpu_share, mem_share = self.cpu_share.get(gpu_type, 0.0), self.mem_share.get(gpu_type, 0.0)
        return cpus <= per_replica * cpu_share and memory_mb <= per_replica * mem_share

    def replicas_capacity(self, gpu_type: str, per_replica: int) -> int:
        """Replicas of ``per_replica`` GPUs the empty cluster holds (one replica never spans nodes)."""
        key = (gpu_type, per_replica)
        if key not in self._shape_cap:
            self._shape_cap[key] = sum(len(n.gpu_ids) // per_replica for n in self.nodes if n.gpu_type == gpu_type)
        return self._shape_cap[key]

    def leaf_replicas_capacity(self, gpu_type: str, per_replica: int) -> int:
        """Replicas of ``per_replica`` GPUs the READY nodes of the roomiest leaf hold when empty.

        A gang of at most this many replicas "fits in one leaf": the leaf-locality rule keeps it there.
        """
        key = (gpu_type, per_replica)
        if key not in self._leaf_cap:
            self._leaf_cap[key] = max(
                (
                    sum(
                        len(self.nodes[ni].gpu_ids) // per_replica
                        for ni in nodes
                        if self.nodes[ni].gpu_type == gpu_type and self.nodes[ni].schedulable
                    )
                    for nodes in self.leaf_nodes
                ),
                default=0,
            )
        return self._leaf_cap[key]

    def fabric_replicas_capacity(self, gpu_type: str, per_replica: int) -> int:
        """Replicas of ``per_replica`` GPUs the roomiest fabric domain holds when empty, on its nodes of
        any state (a one-fabric gang larger than this can never run; one that a drained node keeps out
        waits)."""
        key = (gpu_type, per_replica)
        if key not in self._fabric_cap:
            self._fabric_cap[key] = max(
                (
                    sum(len(self.nodes[ni].gpu_ids) // per_replica for ni in nodes if self.nodes[ni].gpu_type == gpu_type)
                    for nodes in self.fabric_nodes
                ),
                default=0,
            )
        return self._fabric_cap[key]


_CACHE: dict[int, tuple[Topology, TopoIndex]] = {}
_CACHE_SIZE = 8


def topo_index(topology: Topology) -> TopoIndex:
    """The index of ``topology``, reused while the caller passes the same object."""
    hit = _CACHE.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    ix = TopoIndex(topology)
    # Holding the topology keeps its id from being reused by another object.
    _CACHE[id(topology)] = (topology, ix)
    return ix


class FreeState:
    """Free GPUs of READY nodes, with counts per domain and best-fit buckets.

    GPUs of nodes that are not schedulable are never free here: they take no new work.
    """

    __slots__ = (
        "buckets", "cfree", "dfree", "fab_hist", "fab_tfree", "free", "ix", "leaf_hist", "leaf_tfree", "mfree", "pc", "pm",
        "skew", "spine_tfree", "type_free",
    )  # fmt: skip

    def __init__(
        self,
        ix: TopoIndex,
        busy: Iterable[tuple[int, int]] | None = None,
        held: Mapping[Loc, tuple[int, int]] | None = None,
    ) -> None:
        """``busy``: the GPUs running jobs hold; ``held``: the cores and memory each of them carries
        (``spread`` over its replica's GPUs; a GPU not in it carries none)."""
        self.ix = ix
        if busy is None:
            return
        # Per GPU (flat, ``ix.off``): the cores and memory it carries, busy or last taken; per node: free.
        self.pc: list[int] = [0] * ix.gpu_slots
        self.pm: list[int] = [0] * ix.gpu_slots
        if held:
            off = ix.off
            for (ni, p), (c, m) in held.items():
                self.pc[off[ni] + p], self.pm[off[ni] + p] = c, m
        self.cfree: list[int] = list(ix.ncpu)
        self.mfree: list[int] = list(ix.nmem)
        self.skew: dict[str, set[int]] = {}
        self.free: list[list[bool]] = [[n.schedulable] * len(n.gpu_ids) for n in ix.nodes]
        self.dfree: list[list[int]] = [
            [len(pos) if ix.nodes[ni].schedulable else 0 for ni, pos in zip(ix.dom_node[level], ix.dom_pos[level], strict=True)]
            for level in LEVELS
        ]
        nodes = ix.nodes
        pc, pm, off, cfree, mfree = self.pc, self.pm, ix.off, self.cfree, self.mfree
        for ni, p in busy:
            row = self.free[ni]
            if row[p]:
                row[p] = False
                doms = nodes[ni].doms
                self.dfree[NVLINK][doms[NVLINK][p]] -= 1
                self.dfree[PCIE][doms[PCIE][p]] -= 1
                self.dfree[NODE][ni] -= 1
                if held:
                    cfree[ni] -= pc[off[ni] + p]
                    mfree[ni] -= pm[off[ni] + p]
        if held and ix.limited:
            for ni in {ni for ni, _ in held}:
                self._check_skew(ni)
        # (gpu type, level, k) -> heap of domain indexes with k free; stale entries are
        # dropped lazily when they reach the top (an entry is valid if dfree still equals k).
        # None in a copy made for multi-node searches only (``clone(buckets=False)``).
        self.buckets: dict[tuple[str, int, int], list[int]] | None = {}
        for level in LEVELS:
            for d, k in enumerate(self.dfree[level]):
                node = ix.nodes[ix.dom_node[level][d]]
                if k > 0 and node.schedulable:
                    self.buckets.setdefault((node.gpu_type, level, k), []).append(d)  # ascending: a heap
        size = ix.max_node_size + 1
        self.leaf_hist: list[dict[str, list[int]]] = [{} for _ in ix.leaf_names]
        self.leaf_tfree: list[dict[str, int]] = [{} for _ in ix.leaf_names]
        self.spine_tfree: list[dict[str, int]] = [{} for _ in ix.spine_names]
        self.type_free: dict[str, int] = {t: 0 for t in ix.gpu_types}
        for ni, node in enumerate(ix.nodes):
            if not node.schedulable:
                continue
            k = self.dfree[NODE][ni]
            t = node.gpu_type
            self.leaf_hist[node.leaf].setdefault(t, [0] * size)[k] += 1
            self.leaf_tfree[node.leaf][t] = self.leaf_tfree[node.leaf].get(t, 0) + k
            self.spine_tfree[node.spine][t] = self.spine_tfree[node.spine].get(t, 0) + k
            self.type_free[t] += k
        # Per fabric domain, as per leaf (empty lists in a cluster without fabric domains).
        self.fab_hist: list[dict[str, list[int]]] = [{} for _ in ix.fabric_names]
        self.fab_tfree: list[dict[str, int]] = [{} for _ in ix.fabric_names]
        for members in ix.fabric_nodes:
            for ni in members:
                member = ix.nodes[ni]
                if member.schedulable:
                    k, t, fi = self.dfree[NODE][ni], member.gpu_type, member.fabric
                    self.fab_hist[fi].setdefault(t, [0] * size)[k] += 1
                    self.fab_tfree[fi][t] = self.fab_tfree[fi].get(t, 0) + k

    def clone(self, *, buckets: bool = True) -> FreeState:
        """A copy to change apart. ``buckets=False``: without the best-fit buckets, which only searches
        within one node read (``best_domain``); a copy searched only for gangs larger than a node (as
        backfill's replay of job ends often is) then skips keeping them, a third of each update."""
        other = FreeState(self.ix)
        other.free = [row[:] for row in self.free]
        other.dfree = [row[:] for row in self.dfree]
        other.buckets = {k: v[:] for k, v in self.buckets.items()} if buckets and self.buckets is not None else None
        other.leaf_hist = [{t: h[:] for t, h in d.items()} for d in self.leaf_hist]
        other.leaf_tfree = [dict(d) for d in self.leaf_tfree]
        other.spine_tfree = [dict(d) for d in self.spine_tfree]
        if self.fab_tfree:
            other.fab_hist = [{t: h[:] for t, h in d.items()} for d in self.fab_hist]
            other.fab_tfree = [dict(d) for d in self.fab_tfree]
        else:
            other.fab_hist, other.fab_tfree = self.fab_hist, self.fab_tfree  # empty: nothing to change apart
        other.type_free = dict(self.type_free)
        if self.ix.limited:
            other.pc, other.pm = self.pc[:], self.pm[:]
            other.cfree, other.mfree = self.cfree[:], self.mfree[:]
            other.skew = {t: set(nodes) for t, nodes in self.skew.items() if nodes}
        else:  # never written where no node says its cores or memory: shared, not copied
            other.pc, other.pm, other.cfree, other.mfree, other.skew = self.pc, self.pm, self.cfree, self.mfree, self.skew
        return other

    def carry(self, ni: int, positions: tuple[int, ...] | list[int], cpus: int, memory_mb: int) -> None:
        """Set what the GPUs of one replica carry (before ``take``): its cores and memory, spread."""
        off = self.ix.off[ni]
        for p, c, m in zip(positions, spread(cpus, len(positions)), spread(memory_mb, len(positions)), strict=True):
            self.pc[off + p], self.pm[off + p] = c, m

    def _check_skew(self, ni: int) -> None:
        ix = self.ix
        n = len(ix.nodes[ni].gpu_ids)
        nfree = self.dfree[NODE][ni]
        skewed = ix.nodes[ni].schedulable and (
            self.cfree[ni] * n < nfree * ix.ncpu[ni] or self.mfree[ni] * n < nfree * ix.nmem[ni]
        )
        t = ix.nodes[ni].gpu_type
        if skewed:
            self.skew.setdefault(t, set()).add(ni)
        elif t in self.skew:
            self.skew[t].discard(ni)

    def exact_for(self, gpu_type: str, per_replica: int, cpus: int, memory_mb: int) -> bool:
        """Whether the GPU-only search is exact for such a replica: it asks at most every node's share
        per GPU (``TopoIndex.light``) and no node of the type is skewed, or it asks no cores or memory."""
        ix = self.ix
        if not ix.limited or (cpus <= 0 and memory_mb <= 0):
            return True
        return not self.skew.get(gpu_type) and ix.light(gpu_type, per_replica, cpus, memory_mb)

    def room(self, ni: int, per_replica: int, cpus: int, memory_mb: int) -> int:
        """Replicas of ``per_replica`` GPUs, ``cpus`` cores and ``memory_mb`` each that node ``ni`` holds now."""
        k = self.dfree[NODE][ni] // per_replica
        if cpus > 0:
            k = min(k, self.cfree[ni] // cpus)
        if memory_mb > 0:
            k = min(k, self.mfree[ni] // memory_mb)
        return max(k, 0)

    def _change(self, ni: int, positions: tuple[int, ...] | list[int], to_free: bool) -> None:
        node = self.ix.nodes[ni]
        row = self.free[ni]
        delta = 1 if to_free else -1
        changed: list[int] = []
        for p in positions:
            if row[p] == to_free:
                continue
            row[p] = to_free
            changed.append(p)
            for level in LEVELS:
                self.dfree[level][node.doms[level][p]] += delta
        n = len(changed)
        if n == 0:
            return
        ix = self.ix
        if ix.limited:
            off = ix.off[ni]
            pc, pm = self.pc, self.pm
            self.cfree[ni] += delta * sum(pc[off + p] for p in changed)
            self.mfree[ni] += delta * sum(pm[off + p] for p in changed)
        t = node.gpu_type
        if self.buckets is not None:
            # Each domain that changed goes into the bucket of its new count (the order is free: a
            # bucket answers with its smallest valid entry).
            for level in LEVELS:
                doms, dfree = node.doms[level], self.dfree[level]
                for d in {doms[p] for p in changed}:
                    k = dfree[d]
                    if k > 0:
                        heapq.heappush(self.buckets.setdefault((t, level, k), []), d)
        k_new = self.dfree[NODE][ni]
        hist = self.leaf_hist[node.leaf][t]
        hist[k_new - delta * n] -= 1
        hist[k_new] += 1
        self.leaf_tfree[node.leaf][t] += delta * n
        self.spine_tfree[node.spine][t] += delta * n
        self.type_free[t] += delta * n
        fi = node.fabric
        if fi >= 0:
            hist = self.fab_hist[fi][t]
            hist[k_new - delta * n] -= 1
            hist[k_new] += 1
            self.fab_tfree[fi][t] += delta * n
        if ix.limited:
            self._check_skew(ni)

    def take(self, ni: int, positions: tuple[int, ...] | list[int]) -> None:
        """Mark GPUs busy (placed or held for a reservation)."""
        self._change(ni, positions, False)

    def give(self, ni: int, positions: tuple[int, ...] | list[int]) -> None:
        """Mark GPUs free again; a node that takes no new work keeps them unavailable."""
        if self.ix.nodes[ni].schedulable:
            self._change(ni, positions, True)

    def take_locs(self, locs: Iterable[tuple[int, int]]) -> None:
        for ni, positions in _by_node(locs).items():
            self.take(ni, positions)

    def give_locs(self, locs: Iterable[tuple[int, int]]) -> None:
        for ni, positions in _by_node(locs).items():
            self.give(ni, positions)

    def best_domain(self, gpu_type: str, level: int, need: int, max_k: int) -> tuple[int, int] | None:
        """The domain of ``level`` with the fewest free GPUs >= need (best fit), first in topology order."""
        dfree = self.dfree[level]
        if self.buckets is None:
            raise ValueError("best_domain on a FreeState copied without buckets (clone(buckets=False))")
        for k in range(need, max_k + 1):
            heap = self.buckets.get((gpu_type, level, k))
            while heap:
                d = heap[0]
                if dfree[d] == k:
                    return d, k
                heapq.heappop(heap)
        return None

    def max_node_free(self, gpu_type: str) -> int:
        best = 0
        for hist in self.leaf_hist:
            h = hist.get(gpu_type)
            if h is None:
                continue
            for k in range(len(h) - 1, best, -1):
                if h[k]:
                    best = k
                    break
        return best

    def leaf_capacity(self, li: int, gpu_type: str, per_replica: int) -> int:
        """Replicas of ``per_replica`` GPUs that fit in leaf ``li`` now."""
        h = self.leaf_hist[li].get(gpu_type)
        if h is None:
            return 0
        return sum(h[k] * (k // per_replica) for k in range(per_replica, len(h)) if h[k])

    def fabric_capacity(self, fi: int, gpu_type: str, per_replica: int) -> int:
        """Replicas of ``per_replica`` GPUs that fit in fabric domain ``fi`` now."""
        h = self.fab_hist[fi].get(gpu_type)
        if h is None:
            return 0
        return sum(h[k] * (k // per_replica) for k in range(per_replica, len(h)) if h[k])


def _by_node(locs: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for ni, p in locs:
        out.setdefault(ni, []).append(p)
    return out
