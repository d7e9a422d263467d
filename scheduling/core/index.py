"""Topology indexes: the static facts about one cluster that placement searches read.

``TopoIndex`` is built once per ``Topology`` object (cached on object identity:
the simulator and the Celery cycle pass the same object while nodes do not
change, and hashing the whole tuple every cycle would cost more than planning).
What changes within a plan (which GPUs are free) is ``free_state.FreeState``, apart
because it is built and copied for every plan and every trial, the index once per topology.

Fabric domains (multi-node NVLink domains, ``Node.fabric``) are assumed to lie under one leaf switch
(on GB200 NVL72 one rack is one NVLink domain and one leaf). A node whose fabric domain's other nodes
are under another leaf is taken as in no fabric domain (the domain keeps the leaf of its first node in
topology order): a placement "in one fabric domain" is then also in one leaf, which the counted fast
paths of backfill and reclaim rely on. A cluster without fabric domains keeps no fabric counts at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scheduling.core.types import RunningJob, Topology

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
        # Capability -> the nodes that have it (``Node.capabilities``), for jobs that need one.
        self.capable: dict[str, frozenset[int]] = {}
        for ni, node in enumerate(nodes):
            for capability in node.capabilities:
                self.capable[capability] = self.capable.get(capability, frozenset()) | {ni}
        self._allowed: dict[frozenset[str], frozenset[int]] = {}
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
        self._ready: dict[str, list[bool]] = {}
        self.leaf_of_node: list[int] = [n.leaf for n in self.nodes]

    def ready_of_type(self, gpu_type: str) -> list[bool]:
        """Per node: whether it is schedulable and of ``gpu_type`` (a replay of thousands of ends asks per GPU)."""
        found = self._ready.get(gpu_type)
        if found is None:
            found = self._ready[gpu_type] = [n.schedulable and n.gpu_type == gpu_type for n in self.nodes]
        return found

    def allowed_for(self, needs: frozenset[str]) -> frozenset[int] | None:
        """The nodes that have every capability in ``needs``; None: no need, every node may take it."""
        if not needs:
            return None
        found = self._allowed.get(needs)
        if found is None:
            found = frozenset(range(len(self.nodes)))
            for capability in sorted(needs):
                found &= self.capable.get(capability, frozenset())
            self._allowed[needs] = found
        return found

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


_RUNNING: list[tuple[TopoIndex, tuple[RunningJob, ...], RunningLocs]] = []


@dataclass(frozen=True)
class RunningLocs:
    """Each running job's GPUs as (node index, position), and the cores and memory each busy GPU carries
    (``carried``; only where some node is limited by them, ``TopoIndex.limited``)."""

    locs: Mapping[str, tuple[Loc, ...]]
    held: Mapping[Loc, tuple[int, int]]


def running_locs(ix: TopoIndex, running: tuple[RunningJob, ...]) -> RunningLocs:
    """``RunningLocs`` of ``running``, reused while the caller passes the same tuple (plan() and the
    estimated starts read the same snapshot: thousands of jobs, once).

    From one tuple to the next, a job that is the same object as in the last call (the snapshot keeps a
    job whose row and GPUs have not changed: ``selectors.snapshot._running``) keeps its GPUs and what they
    carry from then: a cycle where 16 of 8,000 jobs ended and 16 started looks up 32 jobs' GPUs, not
    8,000 (the lookups were a fifth of such a cycle's plan)."""
    if _RUNNING and _RUNNING[0][0] is ix and _RUNNING[0][1] is running:
        return _RUNNING[0][2]
    gpu_loc = ix.gpu_loc
    limited = ix.limited
    last = _PER_JOB[0][1] if _PER_JOB and _PER_JOB[0][0] is ix else {}
    per_job: dict[str, tuple[RunningJob, tuple[Loc, ...], dict[Loc, tuple[int, int]]]] = {}
    locs: dict[str, tuple[Loc, ...]] = {}
    held: dict[Loc, tuple[int, int]] = {}
    for j in sorted(running, key=_JOB_ID):
        kept = last.get(j.job_id)
        if kept is None or kept[0] is not j:
            carries: dict[Loc, tuple[int, int]] = _NONE_CARRIED
            if limited and (j.cpus_per_replica > 0 or j.memory_mb_per_replica > 0):
                carries = {}
                carried(carries, gpu_loc, j.replicas, j.cpus_per_replica, j.memory_mb_per_replica)
            kept = (j, _locs(gpu_loc, j.replicas), carries)
        per_job[j.job_id] = kept
        locs[j.job_id] = kept[1]
        if kept[2]:
            held.update(kept[2])
    found = RunningLocs(locs, held)
    # Holding the tuple keeps its id from being reused by another object.
    _RUNNING[:] = [(ix, running, found)]
    _PER_JOB[:] = [(ix, per_job)]
    return found


_NONE_CARRIED: dict[Loc, tuple[int, int]] = {}  # (shared, never written: a job that carries nothing)

# Each job's GPUs and what they carry, by job id, from the last ``running_locs`` (with its index).
_PER_JOB: list[tuple[TopoIndex, dict[str, tuple[RunningJob, tuple[Loc, ...], dict[Loc, tuple[int, int]]]]]] = []


def _JOB_ID(j: RunningJob) -> str:
    return j.job_id


def _locs(gpu_loc: Mapping[str, Loc], replicas: tuple[tuple[str, ...], ...]) -> tuple[Loc, ...]:
    """(node index, position) of each GPU; GPUs the topology lacks (a removed node) are skipped."""
    try:
        return tuple([gpu_loc[g] for r in replicas for g in r])
    except KeyError:
        return tuple([gpu_loc[g] for r in replicas for g in r if g in gpu_loc])
