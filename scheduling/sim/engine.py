"""Event-driven trace replay around a policy ``(snapshot, *, now) -> Plan``.

The engine owns time and state; the policy only decides. Arrivals, job ends and
the end of a preemption's grace period are events. Events are batched into
scheduling cycles on a fixed grid (``cycle_s``, the deployment's interval by
default; 0 plans at every arrival and departure): a cycle runs at a grid point
only if something changed since the last one, or every ``wake_s`` while jobs
wait (a policy may act on time alone: a victim passing its minimum run time, a
partial gang timing out). The same Topology object serves the whole replay, so
the core's caches keyed on its identity stay warm.

Every plan is checked before it is applied (placements only on free GPUs of
schedulable nodes of the right type, gangs whole, each replica on one node,
victims actually running); a violation raises ``PlanError`` instead of being
silently repaired, so a replay that finishes is a replay the policy kept honest.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from heapq import heappop, heappush
from typing import Any

from scheduling.core.fairshare import accrue
from scheduling.core.types import (
    PendingJob,
    Plan,
    PlanError,  # the core's own check raises it too; here: a policy's plan that cannot be applied (a policy bug)
    QuotaUnit,
    RunningJob,
    Snapshot,
    Tier,
    Topology,
)
from scheduling.sim.cluster import ROOT, ClusterShape, build_topology, scale_guarantees, span
from scheduling.sim.replay_types import JobState, PlacementRecord, Policy, ReplayConfig, ReplayResult, TeamTally
from scheduling.sim.trace import TraceJob, gang_shape

_END, _RELEASE = 0, 1
BIN_S = 3600.0  # utilisation timeline resolution


class Replay:
    def __init__(
        self,
        jobs: list[TraceJob],
        policy: Policy,
        *,
        shape: ClusterShape,
        limits: Mapping[str, float],
        team_weights: Mapping[str, float],
        config: ReplayConfig = ReplayConfig(),  # noqa: B008 (frozen: one shared default is safe; ruff sees that only in its own module)
        name: str = "",
        observer: Callable[[Replay, Plan], None] | None = None,
    ) -> None:
        self.policy = policy
        self.name = name
        self.shape = shape
        self.cfg = config
        self.observer = observer
        self.topology: Topology = build_topology(shape)
        self.gpu_node: dict[str, str] = {}
        self.node_leaf: dict[str, str] = {}
        self.node_type: dict[str, str] = {}
        self.node_ok: dict[str, bool] = {}
        self.node_spine: dict[str, str] = {}
        for node in self.topology.nodes:
            self.node_leaf[node.name] = node.leaf
            self.node_type[node.name] = node.gpu_type
            self.node_ok[node.name] = node.schedulable
            self.node_spine[node.name] = node.spine
            for gpu in node.gpus:
                self.gpu_node[gpu.id] = node.name
        self.default_type = shape.default_gpu_type

        too_big = [j for j in jobs if j.num_gpus > shape.total_gpus]
        if too_big:
            raise ValueError(f"{len(too_big)} jobs need more GPUs than the cluster has")
        self.states: dict[str, JobState] = {}
        for j in jobs:
            reps, per = gang_shape(j.num_gpus, shape.gpus_per_node)
            self.states[j.job_id] = JobState(
                trace=j,
                replicas=reps,
                per_replica=per,
                limit=limits[j.job_id],
                remaining=j.duration_s,
                pending_since=j.submit_time,
            )
        self.arrivals = deque(jobs)
        self.window = (config.busy_from, max((j.submit_time for j in jobs), default=0.0))

        teams = sorted({j.team for j in jobs} | set(team_weights))
        self.guarantees = {
            gpu_type: scale_guarantees(dict(team_weights), teams, count) for gpu_type, count in shape.gpus_of_type().items()
        }
        self.teams = {t: TeamTally(guarantee=sum(g[t] for g in self.guarantees.values())) for t in teams}
        self.weights = {t: float(team_weights.get(t, 0.0)) or 1.0 for t in teams}
        self.usage = dict.fromkeys(teams, 0.0)  # decayed GPU-seconds
        self.team_held = dict.fromkeys(teams, 0)
        self.team_demand = dict.fromkeys(teams, 0)

        self.now = 0.0
        self.owner: dict[str, str] = {}  # GPU id -> job id
        self.busy = 0
        self.pending: dict[str, PendingJob] = {}
        self.running: dict[str, RunningJob] = {}
        self.events: list[tuple[float, int, int, str, int]] = []
        self._ckpt_heap: list[tuple[float, str, int]] = []  # (next checkpoint, job, attempt)
        self._seq = 0
        self.placements: list[PlacementRecord] = []
        self.util_bins: dict[int, float] = {}
        self.busy_window_gpu_s = 0.0
        self.allocated_gpu_s = 0.0
        self.preemptions = 0
        self.cycles = 0
        self.plan_s = 0.0

    # ------------------------------------------------------------------ clock

    def _advance(self, t: float) -> None:
        """Integrate every time-weighted tally from ``self.now`` to ``t`` (state is constant)."""
        dt = t - self.now
        if dt <= 0:
            return
        busy = self.busy
        self.allocated_gpu_s += busy * dt
        if busy:
            start = self.now
            while start < t:
                b = int(start // BIN_S)
                stop = min(t, (b + 1) * BIN_S)
                self.util_bins[b] = self.util_bins.get(b, 0.0) + busy * (stop - start)
                start = stop
        lo, hi = max(self.now, self.window[0]), min(t, self.window[1])
        if hi > lo:
            w = hi - lo
            self.busy_window_gpu_s += busy * w
            for team, demand in self.team_demand.items():
                if demand:
                    tally = self.teams[team]
                    held = self.team_held[team]
                    due = min(tally.guarantee, demand)
                    tally.demand_s += w
                    tally.used += held * w
                    tally.entitled += due * w
                    tally.honoured += min(held, due) * w
        # Fair-share usage, decayed exactly as the portal's accounting does.
        h = self.cfg.core.half_life_s
        for team in self.usage:
            self.usage[team] = accrue(self.usage[team], self.team_held[team], dt, h)
        self.now = t

    def _push(self, t: float, kind: int, job_id: str, attempt: int) -> None:
        self._seq += 1
        heappush(self.events, (t, self._seq, kind, job_id, attempt))

    # ------------------------------------------------------------------ state changes

    def _pending_job(self, s: JobState) -> PendingJob:
        return PendingJob(
            job_id=s.trace.job_id,
            team=s.trace.team,
            tier=Tier.RESEARCH,
            replicas=s.replicas,
            gpus_per_replica=s.per_replica,
            gpu_type=s.trace.gpu_type or self.default_type,
            submit_time=s.trace.submit_time,
            time_limit=max(s.limit, s.remaining, 1.0),
            locality=self.cfg.leaf_locality,
        )

    def _arrive(self, job: TraceJob) -> None:
        s = self.states[job.job_id]
        self.pending[job.job_id] = self._pending_job(s)
        self.team_demand[job.team] += s.gpus

    def _free(self, s: JobState) -> None:
        for replica in s.alloc:
            for gpu in replica:
                del self.owner[gpu]
        self.busy -= s.gpus
        self.team_held[s.trace.team] -= s.gpus
        s.alloc = ()
        del self.running[s.trace.job_id]

    def _end(self, s: JobState) -> None:
        self._free(s)
        s.slow_gpu_s += s.remaining * (s.stretch - 1.0) * s.gpus
        s.remaining = 0.0
        s.finish = self.now
        self.team_demand[s.trace.team] -= s.gpus

    def _release(self, s: JobState) -> None:
        """A preempted job's grace period is over: it loses the work since its last checkpoint.

        Checkpoints are taken every ``checkpoint_s`` of run time (wall time), so on a slowed placement
        a checkpoint saves less work: ``stretch`` wall seconds per second of work."""
        ran = self.now - s.run_start
        c = self.cfg.checkpoint_s
        kept = math.floor(ran / c) * c if c > 0 else 0.0  # wall seconds up to the last checkpoint
        saved = min(kept / s.stretch, s.remaining)  # the work they did
        s.lost_gpu_s += (ran - saved * s.stretch) * s.gpus
        s.slow_gpu_s += saved * (s.stretch - 1.0) * s.gpus
        s.remaining -= saved
        s.limit = max(s.limit - saved, s.remaining)
        s.preempted += 1
        self._free(s)
        s.pending_since = self.now
        self.pending[s.trace.job_id] = self._pending_job(s)

    def _start(self, s: JobState, replicas: tuple[tuple[str, ...], ...], *, at_risk: bool = False) -> None:
        job_id = s.trace.job_id
        for replica in replicas:
            for gpu in replica:
                self.owner[gpu] = job_id
        del self.pending[job_id]
        s.alloc = replicas
        s.queued_s += self.now - s.pending_since
        if s.first_start is None:
            s.first_start = self.now
        s.run_start = self.now
        s.attempt += 1
        self.busy += s.gpus
        self.team_held[s.trace.team] += s.gpus
        nodes = [self.gpu_node[r[0]] for r in replicas]
        locality, leaves, _ = span(nodes, self.node_leaf, self.node_spine)
        distinct = len(set(nodes))
        # Traffic that crosses the spine (a gang over leaves) or the network at all (a gang that one
        # node could hold, split over nodes) makes every step slower, for the whole attempt.
        slowed = self.cfg.span_slowdown > 0 and (leaves > 1 or (distinct > 1 and s.gpus <= self.shape.gpus_per_node))
        s.stretch = 1.0 + self.cfg.span_slowdown if slowed else 1.0
        s.slowed += slowed
        self.running[job_id] = RunningJob(
            job_id=job_id,
            team=s.trace.team,
            tier=Tier.RESEARCH,
            gpu_type=s.trace.gpu_type or self.default_type,
            replicas=replicas,
            start=self.now,
            # Stretched as the run is: a user whose job runs slower asks for a longer limit, and a policy
            # must not see a slowed gang outrun its own limit (and count it as ending "now").
            time_limit=max(s.limit, s.remaining, 1.0) * s.stretch,
            submit_time=s.trace.submit_time,
            # Kept for the attempt, as the portal keeps it: the policy preempts it when its reservation is due.
            at_risk=at_risk,
        )
        s.at_risk += at_risk
        self._push(self.now + s.remaining * s.stretch, _END, job_id, s.attempt)
        if self.cfg.checkpoint_s > 0:
            heappush(self._ckpt_heap, (self.now + self.cfg.checkpoint_s, job_id, s.attempt))
        self.placements.append(PlacementRecord(job_id, self.now, s.gpus, distinct, leaves, locality, slowed))

    # ------------------------------------------------------------------ cycle

    def quotas(self) -> tuple[QuotaUnit, ...]:
        types = self.guarantees
        units = [
            QuotaUnit(
                name=ROOT,
                parent=None,
                guaranteed={t: sum(g.values()) for t, g in types.items()},
                usage={self.default_type: sum(self.usage.values())},
            )
        ]
        for team in self.teams:
            units.append(
                QuotaUnit(
                    name=team,
                    parent=ROOT,
                    guaranteed={t: g[team] for t, g in types.items()},
                    weight=self.weights[team],
                    usage={self.default_type: self.usage[team]},
                )
            )
        return tuple(units)

    def _refresh_checkpoints(self) -> None:
        """Move ``last_checkpoint`` of the running jobs whose next checkpoint has passed."""
        c = self.cfg.checkpoint_s
        heap, now = self._ckpt_heap, self.now
        while heap and heap[0][0] <= now:
            _, job_id, attempt = heappop(heap)
            r = self.running.get(job_id)
            if r is None or r.terminating or self.states[job_id].attempt != attempt:
                continue
            k = math.floor((now - r.start) / c)
            self.running[job_id] = replace(r, last_checkpoint=r.start + k * c)
            heappush(heap, (r.start + (k + 1) * c, job_id, attempt))

    def snapshot(self) -> Snapshot:
        return Snapshot(
            topology=self.topology,
            running=tuple(self.running.values()),
            pending=tuple(self.pending.values()),
            quotas=self.quotas(),
            config=self.cfg.core,
        )

    def _cycle(self) -> int:
        self._refresh_checkpoints()
        snap = self.snapshot()
        t0 = time.perf_counter()
        plan = self.policy(snap, now=self.now)
        self.plan_s += time.perf_counter() - t0
        self.cycles += 1
        self._apply(plan)
        if self.observer is not None:
            self.observer(self, plan)
        return len(plan.placements)

    def _apply(self, plan: Plan) -> None:
        for p in plan.placements:
            s = self._check_placement(p.job_id, p.replicas)
            self._start(s, p.replicas, at_risk=p.at_risk)
        for pre in plan.preemptions:
            r = self.running.get(pre.job_id)
            if r is None or r.terminating:
                raise PlanError(f"{self.name}: preempts {pre.job_id}, which is not running or already stopping")
            if any(pl.job_id == pre.job_id for pl in plan.placements):
                raise PlanError(f"{self.name}: places and preempts {pre.job_id} in one plan")
            self.running[pre.job_id] = replace(r, terminating=True)
            self.preemptions += 1
            s = self.states[pre.job_id]
            self._push(self.now + self.cfg.core.grace_period_s, _RELEASE, pre.job_id, s.attempt)

    def _check_placement(self, job_id: str, replicas: tuple[tuple[str, ...], ...]) -> JobState:
        job = self.pending.get(job_id)
        if job is None:
            raise PlanError(f"{self.name}: places {job_id}, which is not pending")
        if len(replicas) != job.replicas or any(len(r) != job.gpus_per_replica for r in replicas):
            raise PlanError(
                f"{self.name}: {job_id} placed as {[len(r) for r in replicas]}, "
                f"not {job.replicas} x {job.gpus_per_replica} (gang not whole)"
            )
        seen: set[str] = set()
        for replica in replicas:
            nodes = {self.gpu_node.get(g) for g in replica}
            if len(nodes) != 1 or None in nodes:
                raise PlanError(f"{self.name}: {job_id} has a replica across nodes or on unknown GPUs")
            node = nodes.pop()
            assert node is not None
            if not self.node_ok[node] or self.node_type[node] != job.gpu_type:
                raise PlanError(f"{self.name}: {job_id} placed on {node} (not schedulable or wrong type)")
            for g in replica:
                if g in self.owner or g in seen:
                    raise PlanError(f"{self.name}: {job_id} placed on GPU {g}, which is taken")
                seen.add(g)
        return self.states[job_id]

    # ------------------------------------------------------------------ main loop

    def run(self) -> ReplayResult:
        wall0 = time.perf_counter()
        cyc = self.cfg.cycle_s
        arrivals, events = self.arrivals, self.events
        if not arrivals:
            return self._result(wall0, [])
        # A grid point at or after each change, or (cycle_s 0, event-driven) the change itself.
        grid = math.ceil(arrivals[0].submit_time / cyc) * cyc if cyc > 0 else arrivals[0].submit_time
        self.now = arrivals[0].submit_time
        last_cycle = -math.inf
        idle_cycles = 0
        while arrivals or events or self.pending:
            dirty = False
            while True:
                t_arr = arrivals[0].submit_time if arrivals else math.inf
                t_ev = events[0][0] if events else math.inf
                if min(t_arr, t_ev) > grid:
                    break
                if t_ev <= t_arr:
                    t, _, kind, job_id, attempt = heappop(events)
                    s = self.states[job_id]
                    if attempt != s.attempt or job_id not in self.running:
                        continue  # stale: the attempt was preempted or has already ended
                    self._advance(t)
                    if kind == _END:
                        self._end(s)
                    else:
                        self._release(s)
                else:
                    job = arrivals.popleft()
                    self._advance(job.submit_time)
                    self._arrive(job)
                dirty = True
            self._advance(grid)
            if self.pending and (dirty or grid - last_cycle >= self.cfg.wake_s):
                placed = self._cycle()
                last_cycle = grid
                # Nothing left that could ever free or bring GPUs: stop rather than spin.
                idle_cycles = 0 if (placed or events or arrivals or self.running) else idle_cycles + 1
                if idle_cycles >= 20:
                    break
            nxt = min(arrivals[0].submit_time if arrivals else math.inf, events[0][0] if events else math.inf)
            if self.pending:
                nxt = min(nxt, last_cycle + self.cfg.wake_s)
            if nxt == math.inf:
                break
            grid = max(grid + cyc, math.ceil(nxt / cyc) * cyc) if cyc > 0 else nxt
        unfinished = [j for j, s in self.states.items() if s.finish is None]
        return self._result(wall0, unfinished)

    def _result(self, wall0: float, unfinished: list[str]) -> ReplayResult:
        extra_fn: Any = getattr(self.policy, "extra_metrics", None)
        return ReplayResult(
            policy=self.name,
            shape=self.shape,
            jobs=list(self.states.values()),
            placements=self.placements,
            teams=self.teams,
            util_bins=self.util_bins,
            window=self.window,
            busy_window_gpu_s=self.busy_window_gpu_s,
            allocated_gpu_s=self.allocated_gpu_s,
            preemptions=self.preemptions,
            cycles=self.cycles,
            plan_s=self.plan_s,
            wall_s=time.perf_counter() - wall0,
            unfinished=unfinished,
            extra=dict(extra_fn()) if callable(extra_fn) else {},
        )
