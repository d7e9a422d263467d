"""The free-GPU state that placement searches, for one plan.

``FreeState`` holds which GPUs are free, as integer counts per NVLink domain, PCIe switch, node, fabric
domain, leaf and spine, plus buckets "domains of this GPU type with exactly k free GPUs", so that a
best-fit search is a few bucket lookups instead of a scan of the cluster. Apart from ``index`` (the
topology's static facts, built once per topology) because it changes with every take and give.

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

from scheduling.core.index import LEVELS, NODE, NVLINK, PCIE, Loc, TopoIndex, spread


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
