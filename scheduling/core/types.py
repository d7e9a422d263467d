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
from enum import IntEnum


class Tier(IntEnum):
    """1 production (never preempted, only within guarantee), 2 research, 3 spot."""

    PRODUCTION = 1
    RESEARCH = 2
    SPOT = 3


class Locality(IntEnum):
    """How tightly a gang was placed; lower is better. Ordered by topology level."""

    NVLINK = 0  # every GPU of the gang in one NVLink domain
    PCIE = 1  # one PCIe switch (no common NVLink domain)
    NODE = 2  # one node
    LEAF = 3  # several nodes under one leaf switch
    SPINE = 4  # several leaves under one spine
    CLUSTER = 5  # several spines


# --------------------------------------------------------------------------- topology


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


@dataclass(frozen=True, slots=True)
class Topology:
    """cluster -> spine -> leaf -> node -> (NVLink domain / PCIe switch / NUMA) -> GPU."""

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

    @property
    def gpu_count(self) -> int:
        return self.replicas * self.gpus_per_replica


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
    # How long (since submit) a multi-node gang that fits in one leaf switch may wait for one
    # before it may span leaves. inf: never span (like Slurm's --switches=1, Kueue's "required").
    leaf_wait_s: float = math.inf


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


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    reason: str  # readable: "reclaimed for job 812 (team vision within guarantee)"
    grace_s: float
    for_job: str | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: str
    domain: str  # the topology domain held for it ("leaf-3", "node-17", "cluster")
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


@dataclass(frozen=True, slots=True)
class Verdict:
    """The admission check's answer for one job at submit time."""

    ok: bool
    reason: str  # why it can never run, or where it would fit now
