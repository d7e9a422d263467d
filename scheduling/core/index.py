"""Topology indexes and the free-GPU state that placement searches.

``TopoIndex`` is built once per ``Topology`` object (cached on object identity:
the simulator and the Celery cycle pass the same object while nodes do not
change, and hashing the whole tuple every cycle would cost more than planning).

``FreeState`` holds, for one plan, which GPUs are free, as integer counts per
NVLink domain, PCIe switch, node, leaf and spine, plus buckets "domains of this
GPU type with exactly k free GPUs", so that a best-fit search is a few bucket
lookups instead of a scan of the cluster.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from scheduling.core.types import Topology

# Domain levels inside a node; the values match Locality.NVLINK/PCIE/NODE.
NVLINK, PCIE, NODE = 0, 1, 2
LEVELS = (NVLINK, PCIE, NODE)


@dataclass(frozen=True, slots=True)
class NodeIx:
    name: str
    leaf: int
    spine: int
    gpu_type: str
    schedulable: bool
    gpu_ids: tuple[str, ...]  # by position (GPU index order)
    doms: tuple[tuple[int, ...], ...]  # per level: the global domain index of each position


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
            self.nodes.append(
                NodeIx(
                    name=node.name,
                    leaf=li,
                    spine=self.leaf_spine[li],
                    gpu_type=node.gpu_type,
                    schedulable=node.schedulable,
                    gpu_ids=tuple(g.id for g in gpus),
                    doms=tuple(doms),
                )
            )
            for pos, g in enumerate(gpus):
                self.gpu_loc[g.id] = (ni, pos)
            self.type_total[node.gpu_type] = self.type_total.get(node.gpu_type, 0) + len(gpus)
            self.type_max_node[node.gpu_type] = max(self.type_max_node.get(node.gpu_type, 0), len(gpus))
            self.max_node_size = max(self.max_node_size, len(gpus))
        self.gpu_types: list[str] = sorted(self.type_total)
        # Per type: how many replicas of G GPUs the whole cluster could ever hold (admission).
        self._shape_cap: dict[tuple[str, int], int] = {}
        self._leaf_cap: dict[tuple[str, int], int] = {}

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

    __slots__ = ("buckets", "dfree", "free", "ix", "leaf_hist", "leaf_tfree", "spine_tfree", "type_free")

    def __init__(self, ix: TopoIndex, busy: Iterable[tuple[int, int]] | None = None) -> None:
        self.ix = ix
        if busy is None:
            return
        self.free: list[list[bool]] = [[n.schedulable] * len(n.gpu_ids) for n in ix.nodes]
        self.dfree: list[list[int]] = [
            [len(pos) if ix.nodes[ni].schedulable else 0 for ni, pos in zip(ix.dom_node[level], ix.dom_pos[level], strict=True)]
            for level in LEVELS
        ]
        nodes = ix.nodes
        for ni, p in busy:
            row = self.free[ni]
            if row[p]:
                row[p] = False
                doms = nodes[ni].doms
                self.dfree[NVLINK][doms[NVLINK][p]] -= 1
                self.dfree[PCIE][doms[PCIE][p]] -= 1
                self.dfree[NODE][ni] -= 1
        # (gpu type, level, k) -> heap of domain indexes with k free; stale entries are
        # dropped lazily when they reach the top (an entry is valid if dfree still equals k).
        self.buckets: dict[tuple[str, int, int], list[int]] = {}
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

    def clone(self) -> FreeState:
        other = FreeState(self.ix)
        other.free = [row[:] for row in self.free]
        other.dfree = [row[:] for row in self.dfree]
        other.buckets = {k: v[:] for k, v in self.buckets.items()}
        other.leaf_hist = [{t: h[:] for t, h in d.items()} for d in self.leaf_hist]
        other.leaf_tfree = [dict(d) for d in self.leaf_tfree]
        other.spine_tfree = [dict(d) for d in self.spine_tfree]
        other.type_free = dict(self.type_free)
        return other

    def _change(self, ni: int, positions: tuple[int, ...] | list[int], to_free: bool) -> None:
        node = self.ix.nodes[ni]
        row = self.free[ni]
        delta = 1 if to_free else -1
        touched: set[tuple[int, int]] = set()
        n = 0
        for p in positions:
            if row[p] == to_free:
                continue
            row[p] = to_free
            n += 1
            for level in LEVELS:
                d = node.doms[level][p]
                self.dfree[level][d] += delta
                touched.add((level, d))
        if n == 0:
            return
        t = node.gpu_type
        for level, d in touched:
            k = self.dfree[level][d]
            if k > 0:
                heapq.heappush(self.buckets.setdefault((t, level, k), []), d)
        k_new = self.dfree[NODE][ni]
        hist = self.leaf_hist[node.leaf][t]
        hist[k_new - delta * n] -= 1
        hist[k_new] += 1
        self.leaf_tfree[node.leaf][t] += delta * n
        self.spine_tfree[node.spine][t] += delta * n
        self.type_free[t] += delta * n

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


def _by_node(locs: Iterable[tuple[int, int]]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for ni, p in locs:
        out.setdefault(ni, []).append(p)
    return out
