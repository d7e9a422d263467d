"""The what-if's one door into the trace replay (scheduling/sim): the cluster's own jobs, fleet and quota
tree in, what each job went through out.

The replay engine simulates a uniform cluster with a flat team tree and every job in Tier 2; the
portal's month has a real fleet (leaves of any size), a tree of any depth and three tiers. The engine's
public policy hook closes the gap: the policy handed to it rewrites each snapshot before the core's
``plan()`` sees it (the real topology, the real tree with the engine's fair-share usage, each job's
tier, priority and leaf locality) and maps the plan's GPUs back to the engine's. So the core decides on
exactly what the cycle would give it, while the engine keeps time, runs the events and checks every
plan. Whatever the engine's defaults become, this module pins what the what-if needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from scheduling.core.fairshare import accrue, decay
from scheduling.core.plan import plan as core_plan
from scheduling.core.types import (
    Config,
    LeafLocality,
    PendingJob,
    Placement,
    Plan,
    QuotaUnit,
    RunningJob,
    Snapshot,
    Tier,
    Topology,
)
from scheduling.sim.cluster import ClusterShape, build_topology
from scheduling.sim.engine import Replay
from scheduling.sim.replay_types import ReplayConfig, ReplayResult
from scheduling.sim.trace import TraceJob, gang_shape


@dataclass(frozen=True, slots=True)
class ReplayJob:
    """One job of the window as it was submitted, with the run time it really had."""

    job_id: str
    team: str  # the team's unit key (its slug), as the cycle names it
    tier: int
    gpu_type: str
    replicas: int
    gpus_per_replica: int
    submit_s: float  # seconds from the window's start
    run_s: float  # seconds of work it really ran
    limit_s: float  # its time limit as submitted (its run time where it had none)
    locality: str = LeafLocality.AUTO.value
    priority: int = 0
    cpus_per_replica: int = 0  # 0: not held to any
    memory_mb_per_replica: int = 0

    @property
    def gpus(self) -> int:
        return self.replicas * self.gpus_per_replica


@dataclass(frozen=True, slots=True)
class JobOutcome:
    wait_s: float | None  # submit to first start; None: never started in the replay
    jct_s: float | None  # submit to end; None: did not finish
    held_gpu_s: float  # GPU-seconds it held (grace periods and lost work included)
    preempted: int


@dataclass(frozen=True, slots=True)
class TreeOutcome:
    jobs: dict[str, JobOutcome]
    allocated_gpu_s: float
    busy_by_hour: dict[int, float]  # hour since the window's start -> GPU-seconds held in it
    total_gpus: int
    reshaped: int  # jobs the engine ran as another gang shape of the same GPUs (see ``replay_tree``)
    cycles: int
    wall_s: float


# The portal does not know how often a job checkpoints: hourly, as the replay's traces assume.
CHECKPOINT_S = 3600.0
# The cycle runs every ``cycle_s`` after any change; with nothing changed, while jobs wait, it runs again
# this often (time alone can change a plan: a victim passing its minimum run time).
WAKE_S = 300.0


class Cancelled(Exception):
    """Raised from the progress callback to stop a replay."""


def _engine_shape(fleet: Topology) -> tuple[ClusterShape, list[int]]:
    """The engine's cluster: one engine node per real node, in (GPU type, leaf, name) order, as many GPUs
    per node as the largest real one (a smaller node's extra engine GPUs are never offered)."""
    order = sorted(range(len(fleet.nodes)), key=lambda i: (fleet.nodes[i].gpu_type, fleet.nodes[i].leaf, fleet.nodes[i].name))
    types: list[tuple[str, int]] = []
    for i in order:
        t = fleet.nodes[i].gpu_type
        if types and types[-1][0] == t:
            types[-1] = (t, types[-1][1] + 1)
        else:
            types.append((t, 1))
    per_node = max((len(n.gpus) for n in fleet.nodes), default=8) or 8
    return ClusterShape(nodes=len(order), gpus_per_node=per_node, gpu_types=tuple(types)), order


class _TreePolicy:
    """``plan()`` on the real fleet, tree and jobs; the engine's GPU ids in and out."""

    def __init__(
        self, fleet: Topology, shape: ClusterShape, order: list[int], quotas: Sequence[QuotaUnit], jobs: Sequence[ReplayJob]
    ):
        self.fleet = replace(fleet, nodes=tuple(replace(n, schedulable=True) for n in fleet.nodes))
        self.to_real: dict[str, str] = {}
        self.to_engine: dict[str, str] = {}
        # The engine's own cluster (the same public build_topology it builds): its n-th node is the n-th
        # real node in ``order``, GPU by GPU.
        engine_nodes = build_topology(shape).nodes
        for engine_node, real_index in zip(engine_nodes, order, strict=True):
            for engine_gpu, gpu in zip(engine_node.gpus, fleet.nodes[real_index].gpus, strict=False):
                self.to_real[engine_gpu.id] = gpu.id
                self.to_engine[gpu.id] = engine_gpu.id
        self.quotas = tuple(quotas)
        self.by_id = {j.job_id: j for j in jobs}
        self._running: dict[str, tuple[RunningJob, RunningJob]] = {}
        self._pending: dict[str, tuple[PendingJob, PendingJob]] = {}
        self._held: dict[str, dict[str, int]] = {}  # team -> GPU type -> GPUs held after the last plan
        self._mix: dict[str, dict[str, float]] = {}  # team -> GPU type -> decayed GPU-seconds
        self._last: float | None = None
        self.initial: Mapping[str, Mapping[str, float]] = {}  # team -> GPU type -> usage at the window's start

    def _tree(self, engine_quotas: tuple[QuotaUnit, ...], now: float, half_life_s: float) -> tuple[QuotaUnit, ...]:
        """The real tree with each team's fair-share usage per GPU type, as the cycle gives the core.

        The engine keeps one exact figure per team (all types together); it is split over the types in
        the proportions of the team's own decayed use of each, integrated from what it held after each
        plan (exact while the cycle runs at every change, approximate across idle gaps)."""
        dt = 0.0 if self._last is None else now - self._last
        self._last = now
        for team in set(self._mix) | set(self._held):
            mix, held = self._mix.setdefault(team, {}), self._held.get(team, {})
            for gpu_type in set(mix) | set(held):
                mix[gpu_type] = accrue(mix.get(gpu_type, 0.0), held.get(gpu_type, 0), dt, half_life_s)
        usage: dict[str, Mapping[str, float]] = {}
        for u in engine_quotas:
            if u.parent is None:
                continue
            total, mix = sum(u.usage.values()), self._mix.get(u.name, {})
            whole = sum(mix.values())
            usage[u.name] = {t: total * v / whole for t, v in mix.items()} if whole > 0 else u.usage
        for team, before in self.initial.items():
            mine = dict(usage.get(team, {}))
            for gpu_type, used in before.items():
                mine[gpu_type] = mine.get(gpu_type, 0.0) + decay(used, now, half_life_s)
            usage[team] = mine
        return tuple(replace(u, usage=usage.get(u.name, {})) for u in self.quotas)

    def _hold(self, running: Sequence[RunningJob], placed: Sequence[Placement]) -> None:
        held: dict[str, dict[str, int]] = {}
        for r in running:
            team = held.setdefault(r.team, {})
            team[r.gpu_type] = team.get(r.gpu_type, 0) + sum(len(rep) for rep in r.replicas)
        for p in placed:
            job = self.by_id[p.job_id]
            team = held.setdefault(job.team, {})
            team[job.gpu_type] = team.get(job.gpu_type, 0) + job.gpus
        self._held = held

    def _real_running(self, r: RunningJob) -> RunningJob:
        hit = self._running.get(r.job_id)
        if hit is not None and hit[0] is r:
            return hit[1]
        job = self.by_id[r.job_id]
        to_real = self.to_real
        real = replace(
            r,
            tier=Tier(job.tier),
            priority=job.priority,
            replicas=tuple(tuple(to_real[g] for g in rep) for rep in r.replicas),
            cpus_per_replica=job.cpus_per_replica,
            memory_mb_per_replica=job.memory_mb_per_replica,
        )
        self._running[r.job_id] = (r, real)
        return real

    def _real_pending(self, p: PendingJob) -> PendingJob:
        hit = self._pending.get(p.job_id)
        if hit is not None and hit[0] is p:
            return hit[1]
        job = self.by_id[p.job_id]
        real = replace(
            p,
            tier=Tier(job.tier),
            priority=job.priority,
            locality=LeafLocality(job.locality),
            cpus_per_replica=job.cpus_per_replica,
            memory_mb_per_replica=job.memory_mb_per_replica,
        )
        self._pending[p.job_id] = (p, real)
        return real

    def __call__(self, snapshot: Snapshot, *, now: float) -> Plan:
        # The engine keeps a job's snapshot entry (the same object) until it changes: translate each once.
        running = tuple(self._real_running(r) for r in snapshot.running)
        pending = tuple(self._real_pending(p) for p in snapshot.pending)
        quotas = self._tree(snapshot.quotas, now, snapshot.config.half_life_s)
        real = Snapshot(topology=self.fleet, running=running, pending=pending, quotas=quotas, config=snapshot.config)
        decided = core_plan(real, now=now)
        self._hold(running, decided.placements)
        to_engine = self.to_engine
        placements = tuple(
            replace(p, replicas=tuple(tuple(to_engine[g] for g in rep) for rep in p.replicas)) for p in decided.placements
        )
        return replace(decided, placements=placements)


def replay_tree(
    *,
    jobs: Sequence[ReplayJob],
    fleet: Topology,
    quotas: Sequence[QuotaUnit],
    config: Config,
    cycle_s: float,
    progress: Callable[[float], None] | None = None,
    initial_usage: Mapping[str, Mapping[str, float]] | None = None,
) -> TreeOutcome:
    """Replay ``jobs`` on ``fleet`` under ``quotas`` with the deployment's ``config`` and cycle interval.

    Every job's gang is what the engine derives from its GPU count (``gang_shape``); a job submitted as
    another shape of the same GPUs (2 x 4 on 8-GPU nodes) is counted in ``reshaped``. ``progress`` gets
    the fraction of the window replayed after each cycle; it may raise ``Cancelled``. ``initial_usage``
    (team -> GPU type -> decayed GPU-seconds at the window's start) is what fair share remembers of the
    time before the window; it decays on from there.
    """
    shape, order = _engine_shape(fleet)
    policy = _TreePolicy(fleet, shape, order, quotas, jobs)
    policy.initial = initial_usage or {}
    trace = [
        TraceJob(
            job_id=j.job_id,
            submit_time=j.submit_s,
            duration_s=max(j.run_s, 1.0),
            num_gpus=j.gpus,
            team=j.team,
            user="",
            status="completed",
            gpu_type=j.gpu_type,
        )
        for j in sorted(jobs, key=lambda j: (j.submit_s, j.job_id))
    ]
    reshaped = sum(1 for j in jobs if gang_shape(j.gpus, shape.gpus_per_node) != (j.replicas, j.gpus_per_replica))
    span = max((j.submit_s for j in jobs), default=0.0) or 1.0
    observer = None
    if progress is not None:
        report = progress

        def observer(replay: Replay, _plan: Plan) -> None:
            report(min(replay.now / span, 1.0))

    replay_config = ReplayConfig(
        cycle_s=cycle_s,
        wake_s=max(WAKE_S, cycle_s),
        checkpoint_s=CHECKPOINT_S,
        busy_from=0.0,
        span_slowdown=0.0,
        leaf_locality=LeafLocality.AUTO,
        core=config,
    )
    result = Replay(
        trace,
        policy,
        shape=shape,
        limits={j.job_id: max(j.limit_s, j.run_s, 1.0) for j in jobs},
        team_weights=dict.fromkeys({j.team for j in jobs}, 1.0),
        config=replay_config,
        name="what-if",
        observer=observer,
    ).run()
    return _outcome(result, sum(len(n.gpus) for n in fleet.nodes), reshaped)


def _outcome(result: ReplayResult, total_gpus: int, reshaped: int) -> TreeOutcome:
    out = {}
    for s in result.jobs:
        submit = s.trace.submit_time
        held = 0.0 if s.finish is None else (s.finish - submit - s.queued_s) * s.gpus
        out[s.trace.job_id] = JobOutcome(
            wait_s=None if s.first_start is None else s.first_start - submit,
            jct_s=None if s.finish is None else s.finish - submit,
            held_gpu_s=held,
            preempted=s.preempted,
        )
    return TreeOutcome(out, result.allocated_gpu_s, dict(result.util_bins), total_gpus, reshaped, result.cycles, result.wall_s)
