"""The scheduler core's contract: a snapshot in, a plan out.

Everything here is a frozen dataclass of plain values, so that the Celery cycle,
the trace simulator, the benchmarks and the property tests build the same input
and read the same output. No Django, no I/O, no clock: "now" is passed in.

Identifiers are strings chosen by the caller (database ids as text in the
portal, trace ids in the simulator). Times are seconds on any monotone scale
(epoch seconds in the portal, trace seconds in the simulator).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


def id_order(job_id: str) -> tuple[int, int, str]:
    """The order of job ids where nothing else decides: numbers as numbers ("9" before "10": the
    portal's ids are database ids as text), then any other id in text order. So an id not assigned
    yet ("new", the admission preview's) comes after every real one, where the job it stands for
    will come once it is submitted: a preview and the next cycle break ties alike."""
    if job_id.isascii() and job_id.isdigit():
        return (0, int(job_id), "")
    return (1, 0, job_id)


class Tier(IntEnum):
    """1 production (never preempted, only within guarantee), 2 research, 3 spot."""

    PRODUCTION = 1
    RESEARCH = 2
    SPOT = 3


class LeafLocality(StrEnum):
    """How a multi-node gang that one leaf switch could hold is placed (``PendingJob.locality``).

    Spanning leaves puts the gang's all-reduce on the spine for its whole run, which makes it slower
    (``Config.span_slowdown``); waiting for a leaf costs the wait. ``auto`` weighs the two.
    """

    AUTO = "auto"  # wait for one leaf only while the expected wait is less than spanning would cost
    REQUIRED = "required"  # one leaf or wait (Slurm's --switches=1, Kueue's podset-required-topology)
    PREFERRED = "preferred"  # one leaf if one has room now, else span at once (Kueue's preferred topology)


class Locality(IntEnum):
    """How tightly a gang was placed; lower is better. Ordered by topology level."""

    NVLINK = 0  # every GPU of the gang in one NVLink domain
    PCIE = 1  # one PCIe switch (no common NVLink domain)
    NODE = 2  # one node
    # Several nodes of one multi-node NVLink domain (``Node.fabric``). Placed between NODE and LEAF, and the
    # levels above renumbered: nothing persists the integers (the portal stores words, ``cycle_placements.LOCALITY_WORDS``).
    FABRIC = 3
    LEAF = 4  # several nodes under one leaf switch
    SPINE = 5  # several leaves under one spine
    CLUSTER = 6  # several spines


# --------------------------------------------------------------------------- topology

# A node capability (``Node.capabilities``, ``PendingJob.needs``): the node's agent runs containers.
CONTAINERS = "containers"
NO_CAPABILITIES: frozenset[str] = frozenset()
WITH_CONTAINERS: frozenset[str] = frozenset({CONTAINERS})


@dataclass(frozen=True, slots=True)
class Gpu:
    id: str  # unique in the cluster (the GPU's UUID, or "node/index")
    index: int  # index on its node (what CUDA_VISIBLE_DEVICES names)
    nvlink: str  # NVLink domain id, unique in the cluster
    pcie: str  # PCIe switch id, unique in the cluster
    numa: str  # NUMA node id, unique in the cluster


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    leaf: str
    spine: str
    gpu_type: str  # every GPU of a node is of one type ("H100", "A100", ...)
    gpus: tuple[Gpu, ...]
    # Only READY nodes take new work. A NOT_READY/DRAINING/DOWN node keeps its
    # running tasks in the snapshot (they still hold GPUs) but gets no placement.
    schedulable: bool = True
    # CPU cores and memory (MiB) that jobs may be given, the system reserve already taken off. 0: not
    # known (an agent that does not say, a trace): that resource never limits a placement on the node.
    cpus: int = 0
    memory_mb: int = 0
    # The multi-node NVLink domain the node is in (a GB200 NVL72 rack: 18 trays of 4 GPUs in one NVLink
    # fabric), unique in the cluster; "": none. Every node of a fabric domain is under one leaf switch.
    fabric: str = ""
    # What the node can do beyond its GPUs (``CONTAINERS``: it has a container runtime); a job that
    # ``PendingJob.needs`` one is placed only on nodes that have it.
    capabilities: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Topology:
    """cluster -> spine -> leaf -> [fabric domain] -> node -> (NVLink domain / PCIe switch / NUMA) -> GPU."""

    nodes: tuple[Node, ...]


# --------------------------------------------------------------------------- work


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A gang that holds GPUs now (STARTING, RUNNING or PREEMPTING)."""

    job_id: str
    team: str  # the team's QuotaUnit name
    tier: Tier
    gpu_type: str
    replicas: tuple[tuple[str, ...], ...]  # GPU ids, one tuple per replica
    start: float
    time_limit: float  # seconds from start; the job is killed after it
    last_checkpoint: float | None = None  # newest checkpoint time; None: none yet
    priority: int = 0
    submit_time: float = 0.0
    # Already told to stop (PREEMPTING or being cancelled): its GPUs free up
    # within the grace period; never chosen as a victim again.
    terminating: bool = False
    # Started at risk on GPUs held for a reservation (``Placement.at_risk``): stopped, with the grace
    # period, when that reservation comes due, however short a time it has run.
    at_risk: bool = False
    # What each replica holds beside its GPUs, on its node: CPU cores and memory (MiB).
    cpus_per_replica: int = 0
    memory_mb_per_replica: int = 0
    name: str = ""  # the job's name, for reasons people read ("" where it has none)

    @property
    def gpu_count(self) -> int:
        return sum(len(r) for r in self.replicas)


@dataclass(frozen=True, slots=True)
class PendingJob:
    """A gang waiting to be placed: replicas x gpus_per_replica GPUs of one type."""

    job_id: str
    team: str
    tier: Tier
    replicas: int
    gpus_per_replica: int
    gpu_type: str
    submit_time: float
    time_limit: float  # seconds; used for reservations and backfill
    priority: int = 0  # higher first, within a team and tier
    locality: LeafLocality = LeafLocality.AUTO  # a gang that one leaf could hold: wait for one?
    # Each replica also needs this many CPU cores and MiB of memory free on its node (0: none asked;
    # only nodes that report their cores and memory, ``Node.cpus``/``memory_mb``, are held to them).
    cpus_per_replica: int = 0
    memory_mb_per_replica: int = 0
    # All its nodes in one multi-node NVLink domain (``Node.fabric``), or wait (Slurm's ``--segment``): for
    # tensor parallelism across nodes. A gang placed on one node always satisfies it.
    one_fabric: bool = False
    # Each replica on a node of its own (Slurm's --nodes=N: N distinct nodes), never two on one node.
    one_per_node: bool = False
    name: str = ""  # the job's name, for reasons people read ("" where it has none)
    # Node capabilities every node of its placement must have (``Node.capabilities``): ``CONTAINERS``
    # for a job that runs in an image.
    needs: frozenset[str] = frozenset()

    @property
    def gpu_count(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def spread(self) -> bool:
        """Its replicas must be on distinct nodes (``one_per_node`` with more than one replica)."""
        return self.one_per_node and self.replicas > 1


# --------------------------------------------------------------------------- quotas


@dataclass(frozen=True, slots=True)
class QuotaUnit:
    """One unit of the org tree: the root (cluster), business unit, department or team.

    Per GPU type: ``guaranteed`` GPUs, an optional ``limit`` (the most it may hold
    with borrowing; a missing key means no limit), and ``weight`` for sharing idle
    capacity. ``usage`` is GPU-seconds per GPU type, already decayed with the
    configured half-life by the caller (see ``fairshare.decay``).
    Jobs belong to teams only, i.e. to leaves of this tree.
    """

    name: str
    parent: str | None
    guaranteed: Mapping[str, int] = field(default_factory=dict)
    limit: Mapping[str, int] = field(default_factory=dict)
    weight: float = 1.0
    usage: Mapping[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True, slots=True)
class Config:
    half_life_s: float = 7 * 24 * 3600.0  # fair-share usage decay
    grace_period_s: float = 60.0  # SIGTERM -> SIGKILL for preempted jobs
    min_runtime_s: float = 600.0  # a job runs this long before it may be preempted
    preemption: bool = True
    backfill: bool = True
    max_reservations: int = 1  # EASY backfill: one reservation
    # Jobs that may preempt (reclaim) in one plan, each for as many victims as it needs. A state change
    # (a quota edit, a rule change) can make hundreds eligible at once; like Slurm's queue depth and
    # Kueue's one head per queue per cycle, the rest wait for the next cycle, a few seconds on, while
    # the victims already chosen take their grace period anyway.
    max_reclaims: int = 8
    # How long (since submit) a multi-node gang that fits in one leaf switch may wait for one
    # before it may span leaves, whatever its locality says. inf: no bound.
    leaf_wait_s: float = math.inf
    # How much longer a gang runs when it spans leaf switches (0.25: 25 % more wall time; the industry
    # reports 25-40 % across spine hops). A gang of ``LeafLocality.AUTO`` waits for one leaf while the
    # wait it expects is less than this x its time limit. inf: every such gang waits (as "required");
    # 0: none does (as "preferred").
    span_slowdown: float = 0.25
    # Searches for an ``auto`` gang's expected start (one leaf, or leaves) in one plan. Each replays the
    # running jobs' ends (milliseconds on a busy cluster of thousands of GPUs), and a plan state that
    # changed between two gangs of one shape needs a fresh one; past the budget, like Slurm's
    # bf_max_job_test, a gang that would need one waits for one leaf this cycle and weighs again at
    # the next. Answers found earlier in the plan (the same shape, or a bound that decides) are free.
    max_leaf_searches: int = 4
    # EASY backfill at risk: a Tier 2/3 job that would outlive a reservation may still start on the
    # GPUs it holds, and is preempted (with the grace period) when the reservation comes due. Off by
    # default: the caller must keep ``RunningJob.at_risk`` from ``Placement.at_risk`` across cycles.
    backfill_at_risk: bool = False
    # Aging: a pending job that has waited this long since submit is ordered before the fair-share order
    # of its tier (and of its in-guarantee/borrowing group), oldest first, so that fair share cannot keep
    # a heavy team's job waiting without bound. inf: no aging (pure fair share).
    age_first_s: float = math.inf
    # Starvation guard for the EASY reservation: the oldest pending job, once it has waited this long since
    # submit, gets a reservation beyond ``max_reservations`` if it cannot start (EASY in submit order, as
    # Slurm's, always reserves for its oldest job). inf: off.
    aged_reservation_s: float = math.inf


@dataclass(frozen=True, slots=True)
class Snapshot:
    topology: Topology
    running: tuple[RunningJob, ...]
    pending: tuple[PendingJob, ...]
    quotas: tuple[QuotaUnit, ...]
    config: Config = Config()


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    replicas: tuple[tuple[str, ...], ...]  # GPU ids, one tuple per replica, rank order
    nodes: tuple[str, ...]  # node of each replica, rank order
    locality: Locality
    leaves: int  # leaf switches spanned
    spines: int  # spines spanned
    borrowed: bool  # runs (partly) beyond its team's guarantee: reclaimable
    # Uses GPUs held for a reservation that starts before it would end (``Config.backfill_at_risk``):
    # the caller keeps it as ``RunningJob.at_risk`` while the job runs.
    at_risk: bool = False


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    reason: str  # readable: "reclaimed for job 812 (team vision within guarantee)"
    grace_s: float
    for_job: str | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    domain: str  # the topology domain held for it ("leaf-3", "node-17", a fabric domain, "cluster")
    earliest_start: float
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...]
    preemptions: tuple[Preemption, ...]
    reservations: tuple[Reservation, ...]
    # every pending job not placed by this plan -> a reason a person can act on
    pending_reasons: Mapping[str, str]
    # pending job -> estimated start (same time scale as ``now``), where known
    estimated_start: Mapping[str, float] = field(default_factory=dict)
    # running job -> True if it now runs beyond its team's guarantee (reclaimable)
    borrowed: Mapping[str, bool] = field(default_factory=dict)


class PlanError(RuntimeError):
    """A plan that breaks its own contract (one job named twice, a victim that is not running): a
    scheduler bug. Raised instead of handed on, so that no caller applies it (a duplicate stop order)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The admission check's answer for one job at submit time."""

    ok: bool
    reason: str  # why it can never run, or where it would fit now
