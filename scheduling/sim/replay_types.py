"""The replay's contract: the policy it calls, its settings, each job's state and what it reports.

Apart from ``engine`` (which owns time and runs the events) so that the policies, the metrics and the
tests name these without the engine: a policy is a function of a snapshot, a metric one of a result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from scheduling.core.types import Config, LeafLocality, Locality, Plan, Snapshot
from scheduling.sim.cluster import ClusterShape
from scheduling.sim.trace import TraceJob


class Policy(Protocol):
    def __call__(self, snapshot: Snapshot, *, now: float) -> Plan: ...


# The deployment's cycle interval (portal/yard_settings.py, YARD_CYCLE_INTERVAL_S): a replay cycles as
# often by default, so its waits have the deployment's floor, not a coarser grid's.
DEPLOYMENT_CYCLE_S = 5.0


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    # Seconds between cycles; 0 plans at every arrival and departure (event-driven).
    cycle_s: float = DEPLOYMENT_CYCLE_S
    wake_s: float = 600.0
    checkpoint_s: float = 3600.0  # 0: jobs never checkpoint
    busy_from: float = 20 * 86400.0  # metrics window start (trace README: steady state)
    # What topology costs: a gang that spans leaf switches, or one that would fit one node but is split
    # over nodes, runs this much longer (0.25: 25 % more wall time for the same work) for as long as it
    # keeps that placement. Every policy pays it alike; it is the replay's truth, not a policy's belief
    # (the core's own estimate of it is ``core.span_slowdown``).
    span_slowdown: float = 0.0
    # What every job of the trace asks of a leaf switch (``PendingJob.locality``, the portal's leaf_locality).
    leaf_locality: LeafLocality = LeafLocality.AUTO
    core: Config = field(default_factory=Config)


@dataclass(slots=True)
class JobState:
    trace: TraceJob
    replicas: int
    per_replica: int
    limit: float  # time limit of the whole job; shrinks by the work a checkpoint saved
    remaining: float  # seconds of work left
    pending_since: float
    queued_s: float = 0.0
    first_start: float | None = None
    finish: float | None = None
    run_start: float = 0.0
    attempt: int = 0
    preempted: int = 0
    lost_gpu_s: float = 0.0
    slow_gpu_s: float = 0.0  # GPU-seconds of useful work's extra run time on slowed placements
    stretch: float = 1.0  # wall seconds per second of work on the current placement (1 + slowdown)
    slowed: int = 0  # attempts that ran on a slowed placement
    at_risk: int = 0  # attempts started at risk on reserved GPUs
    alloc: tuple[tuple[str, ...], ...] = ()

    @property
    def gpus(self) -> int:
        return self.replicas * self.per_replica


@dataclass(frozen=True, slots=True)
class PlacementRecord:
    job_id: str
    time: float
    gpus: int
    nodes: int
    leaves: int
    locality: Locality
    slowed: bool = False


@dataclass(slots=True)
class TeamTally:
    """Integrals over the metrics window, in GPU-seconds (or seconds for demand_s)."""

    guarantee: int
    demand_s: float = 0.0  # time during which the team had running or waiting jobs
    used: float = 0.0  # GPU-seconds held while it had demand
    entitled: float = 0.0  # integral of min(guarantee, demand)
    honoured: float = 0.0  # integral of min(held, guarantee, demand)


@dataclass(slots=True)
class ReplayResult:
    policy: str
    shape: ClusterShape
    jobs: list[JobState]
    placements: list[PlacementRecord]
    teams: dict[str, TeamTally]
    util_bins: dict[int, float]  # hour index -> busy GPU-seconds in it
    window: tuple[float, float]
    busy_window_gpu_s: float
    allocated_gpu_s: float
    preemptions: int
    cycles: int
    plan_s: float
    wall_s: float
    unfinished: list[str] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
