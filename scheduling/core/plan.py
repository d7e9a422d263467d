"""The scheduler's one entry point: ``plan(snapshot, now=...) -> Plan``."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field

from scheduling.core import reasons
from scheduling.core.backfill import Release, earliest_fit
from scheduling.core.fairshare import team_order
from scheduling.core.index import FreeState, TopoIndex, topo_index
from scheduling.core.placement import Fit, find, keep_in_leaf, take_fit
from scheduling.core.preemption import Reclaimer
from scheduling.core.quota import QuotaState, borrowed_running
from scheduling.core.types import (
    PendingJob,
    Placement,
    Plan,
    Preemption,
    Reservation,
    Snapshot,
    Tier,
)

Loc = tuple[int, int]


def plan(snapshot: Snapshot, *, now: float) -> Plan:
    """Decide what starts, what is preempted and what is reserved, for one scheduling cycle.

    Contract:
    - Pure and deterministic: no clock, no I/O, no randomness; the same snapshot and ``now``
      give the same plan, whatever the order of the snapshot's tuples.
    - Pending jobs are taken in order: Tier 1, 2, 3; within a tier, work within its team's
      guarantee before work that would borrow, then teams in hierarchical fair-share order
      (``fairshare.team_order``); within a team, priority (high first), then submit time,
      then job_id.
    - A gang is placed whole or not at all, in the lowest topology domain that holds it,
      best fit (``placement.find``), on GPUs free of running jobs, of this plan's
      placements and of reservations; never beyond a limit of its team or an ancestor;
      Tier 1 only within its team's guarantee. ``Placement.borrowed`` marks what runs
      beyond the team's guarantee.
    - A multi-node gang that the READY nodes of one leaf switch could hold is placed under
      one leaf or not at all: it waits (reserving the leaf where it fits earliest) rather than
      span leaves, until it has waited ``Config.leaf_wait_s`` (``placement.keep_in_leaf``);
      reclaim looks for a one-leaf placement for it too.
    - A Tier 1 job, or a Tier 2 job within its team's guarantee, that does not fit may
      preempt (``preemption.Reclaimer``); it then holds a reservation on the GPUs it
      freed, which nobody else gets in this plan. Tier 1 and terminating jobs, and jobs
      younger than ``Config.min_runtime_s``, are never victims.
    - The first jobs in order that cannot start (up to ``Config.max_reservations``) get a
      reservation at their earliest start; later jobs start only on GPUs outside every
      reservation, or inside one if they end (by their time limit) before it starts.
    - Every pending job not placed gets a reason in ``Plan.pending_reasons``.
    """
    # Python's cyclic GC, triggered by the planner's many short-lived tuples, would rescan every
    # object of the snapshot each time: work that grows with the snapshot on every collection, which
    # made a 4x cluster cost 5.3x (bench/core_plan.py). What the planner allocates holds no cycles
    # and is freed by reference counting; the collector resumes (if it ran before) when plan returns.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _Planner(snapshot, now).run()
    finally:
        if collecting:
            gc.enable()


@dataclass(slots=True)
class _Held:
    """A backfill reservation in this plan, and which of its GPUs are free now (held out of the pool)."""

    job_id: str
    gpu_type: str
    start: float
    domain: str
    free_now: set[Loc] = field(default_factory=set)


class _Planner:
    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snap = snapshot
        self.now = now
        self.cfg = snapshot.config
        self.ix: TopoIndex = topo_index(snapshot.topology)
        self.running = tuple(sorted(snapshot.running, key=lambda j: j.job_id))
        gpu_loc = self.ix.gpu_loc
        # Each running job's GPUs as (node index, position), computed once for every use below.
        self.locs = {j.job_id: _locs(gpu_loc, j.replicas) for j in self.running}
        self.st = FreeState(self.ix, (loc for locs in self.locs.values() for loc in locs))
        self.quota = QuotaState(snapshot.quotas, self.running)
        self.borrowed = borrowed_running(snapshot.quotas, self.running)
        self.placements: list[Placement] = []
        self.placed_fits: list[tuple[PendingJob, Fit]] = []
        self.preemptions: list[Preemption] = []
        self.reservations: list[Reservation] = []
        self.reasons: dict[str, str] = {}
        self.estimated: dict[str, float] = {}
        self.held: list[_Held] = []  # backfill reservations
        self.reserved: set[Loc] = set()  # GPUs of every reservation (backfill and reclaim)
        self.victims: set[str] = set()
        self._reclaimer: Reclaimer | None = None
        # Free GPUs only shrink while planning, so a shape that failed keeps failing:
        # (type, per replica, one leaf only) -> the fewest replicas known not to fit.
        self._fails: dict[tuple[str, int, bool], int] = {}
        self._reclaim_fails: set[tuple[Tier, str, str, int, int, bool]] = set()
        self._reason_cache: dict[tuple[str, int, int, bool], str] = {}
        self._never: dict[tuple[str, int, int], str | None] = {}
        self._blocked_cache: dict[tuple[str, int, int, bool, int, int], str] = {}
        self._held_version = 0  # bumped whenever a backfill reservation's held GPUs change
        self._strict_block: dict[str, str] = {}  # backfill off: type -> first blocked job
        self._lend_fails: dict[tuple[str, int, bool, tuple[str, ...]], int] = {}

    # ------------------------------------------------------------------ main loop

    def run(self) -> Plan:
        for job in self._ordered():
            self._one(job)
        return Plan(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            reservations=tuple(self.reservations),
            pending_reasons=self.reasons,
            estimated_start=self.estimated,
            borrowed=self.borrowed,
        )

    def _ordered(self) -> list[PendingJob]:
        """Tier; then work within its team's guarantee before work that would borrow; then fair share;
        then priority, submit time, job id.

        Guaranteed work goes first inside a tier so that a reclaim is not undone by the next cycle:
        the GPUs a preemptor freed would otherwise go to a borrower ranked above it by fair share,
        and it would preempt again.
        """
        rank = team_order(self.snap.quotas, self.ix.type_total)
        last = len(rank)

        def within_team(j: PendingJob) -> tuple[int, int, float, str]:
            return (j.tier, -j.priority, j.submit_time, j.job_id)

        # A team's jobs use its guarantee in the team's own order; the first that would not fit borrows.
        in_guarantee: set[str] = set()
        queued: dict[tuple[str, str], int] = {}
        for j in sorted(self.snap.pending, key=within_team):
            key = (j.team, j.gpu_type)
            queued[key] = queued.get(key, 0) + j.gpu_count
            if self.quota.within_guarantee(j.team, j.gpu_type, queued[key]):
                in_guarantee.add(j.job_id)
        return sorted(
            self.snap.pending,
            key=lambda j: (j.tier, j.job_id not in in_guarantee, rank.get(j.team, last), j.team, *within_team(j)[1:]),
        )

    def _one(self, job: PendingJob) -> None:
        t, r, g = job.gpu_type, job.replicas, job.gpus_per_replica
        shape = (t, r, g)
        if shape not in self._never:
            self._never[shape] = reasons.never(self.ix, t, r, g) if r > 0 and g > 0 else "asks for no GPUs"
        impossible = self._never[shape]
        if impossible is not None:
            self.reasons[job.job_id] = f"can never run: {impossible}"
            return
        over = self.quota.blocked(job)
        if over is not None:
            self.reasons[job.job_id] = over
            return
        if t in self._strict_block:
            self.reasons[job.job_id] = f"waiting behind job {self._strict_block[t]} (strict order: backfill is off)"
            return
        fit = self._find(t, r, g, self._one_leaf(job))
        if fit is None and self.held:
            fit = self._find_before_reservations(job)
        if fit is not None:
            self._place(job, fit)
            return
        if self.cfg.preemption and self._may_preempt(job) and self._reclaim(job):
            return
        if not self.cfg.backfill:
            self._strict_block[t] = job.job_id
        if self.cfg.backfill and len(self.held) < self.cfg.max_reservations and self._reserve(job):
            return
        self.reasons[job.job_id] = self._blocked_reason(job)

    # ------------------------------------------------------------------ placement

    def _one_leaf(self, job: PendingJob) -> bool:
        return keep_in_leaf(self.ix, job, self.cfg, self.now)

    def _find(self, t: str, r: int, g: int, one_leaf: bool) -> Fit | None:
        key = (t, g, one_leaf)
        failed = self._fails.get(key)
        if failed is not None and r >= failed:
            return None
        fit = find(self.st, t, r, g, one_leaf=one_leaf)
        if fit is None:
            self._fails[key] = min(r, failed) if failed is not None else r
        return fit

    def _find_before_reservations(self, job: PendingJob) -> Fit | None:
        """EASY backfill: a job that ends before a reservation starts may use its free GPUs meanwhile."""
        end = self.now + job.time_limit
        usable = [h for h in self.held if end <= h.start and h.free_now]
        if not usable:
            return None
        # The pool (free GPUs plus those lent) only shrinks too, so failures are cached as in _find.
        one_leaf = self._one_leaf(job)
        key = (job.gpu_type, job.gpus_per_replica, one_leaf, tuple(h.job_id for h in usable))
        failed = self._lend_fails.get(key)
        if failed is not None and job.replicas >= failed:
            return None
        lent = sorted({loc for h in usable for loc in h.free_now})
        self.st.give_locs(lent)
        fit = find(self.st, job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf=one_leaf)
        if fit is None:
            self._lend_fails[key] = min(job.replicas, failed) if failed is not None else job.replicas
        used = {(ni, p) for ni, positions in fit.replicas for p in positions} if fit else set()
        self.st.take_locs(loc for loc in lent if loc not in used)
        if used:
            for h in usable:
                h.free_now -= used
            self._held_version += 1
        return fit

    def _place(self, job: PendingJob, fit: Fit) -> None:
        borrowed = self.quota.would_borrow(job.team, job.gpu_type, job.gpu_count)
        take_fit(self.st, fit)
        self.quota.add(job.team, job.gpu_type, job.gpu_count)
        self.placements.append(fit.placement(self.ix, job.job_id, borrowed=borrowed))
        self.placed_fits.append((job, fit))

    # ------------------------------------------------------------------ reclaim

    def _may_preempt(self, job: PendingJob) -> bool:
        if job.tier == Tier.PRODUCTION:
            return True
        return job.tier == Tier.RESEARCH and self.quota.within_guarantee(job.team, job.gpu_type, job.gpu_count)

    def _reclaim(self, job: PendingJob) -> bool:
        one_leaf = self._one_leaf(job)
        key = (job.tier, job.team, job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf)
        if key in self._reclaim_fails:
            return False
        if self._reclaimer is None:
            self._reclaimer = Reclaimer(self.ix, self.running, self.locs, self.borrowed, self.cfg, self.now)
            self._reclaimer.claim((), set(self.reserved))
        found = self._reclaimer.find(self.st, job, one_leaf=one_leaf)
        if found is None:
            self._reclaim_fails.add(key)
            return False
        start = self.now + self.cfg.grace_period_s
        why = (
            f"preempted for Tier 1 job {job.job_id}"
            if job.tier == Tier.PRODUCTION
            else f"reclaimed for job {job.job_id} (team {job.team} within guarantee)"
        )
        for victim in found.victims:
            self.preemptions.append(
                Preemption(job_id=victim.job_id, reason=why, grace_s=self.cfg.grace_period_s, for_job=job.job_id)
            )
        self.victims.update(j.job_id for j in found.waits_on)
        self._reclaimer.claim(found.waits_on, set())
        self._hold(found.fit)
        self.quota.add(job.team, job.gpu_type, job.gpu_count)
        self.reservations.append(Reservation(job.job_id, found.fit.domain, start, found.fit.gpu_ids(self.ix)))
        self.estimated[job.job_id] = start
        if found.victims:
            names = ", ".join(v.job_id for v in found.victims)
            self.reasons[job.job_id] = (
                f"preempting {len(found.victims)} job(s) ({names}) to free {found.fit.domain}; "
                f"starts {reasons.relative(start - self.now)}"
            )
        else:
            names = ", ".join(v.job_id for v in found.waits_on)
            self.reasons[job.job_id] = (
                f"waiting for stopping job(s) {names} to free {found.fit.domain}; starts {reasons.relative(start - self.now)}"
            )
        return True

    def _hold(self, fit: Fit) -> set[Loc]:
        """Take a reservation's GPUs out of the pool; return those that were free."""
        locs = {(ni, p) for ni, positions in fit.replicas for p in positions}
        self.reserved |= locs
        if self._reclaimer is not None:
            self._reclaimer.claim((), locs)
        free_now = {loc for loc in locs if self.st.free[loc[0]][loc[1]]}
        self.st.take_locs(sorted(free_now))
        return free_now

    # ------------------------------------------------------------------ reservations

    def _releases(self) -> list[Release]:
        grace_end = self.now + self.cfg.grace_period_s
        out: list[Release] = []
        for j in self.running:
            end = j.start + j.time_limit
            if j.terminating or j.job_id in self.victims:
                end = min(end, grace_end)
            out.append(Release(max(end, self.now), j.job_id, self.locs[j.job_id]))
        for job, fit in self.placed_fits:
            locs = tuple((ni, p) for ni, positions in fit.replicas for p in positions)
            out.append(Release(self.now + job.time_limit, job.job_id, locs))
        out.sort(key=lambda rel: (rel.end, rel.job_id))
        return out

    def _reserve(self, job: PendingJob) -> bool:
        found = earliest_fit(
            self.st,
            self._releases(),
            self.reserved,
            job.gpu_type,
            job.replicas,
            job.gpus_per_replica,
            one_leaf=self._one_leaf(job),
        )
        if found is None:
            return False
        start, fit = found
        base = self._shape_reason(job)  # before the hold changes what is free
        free_now = self._hold(fit)
        self._held_version += 1
        self.held.append(_Held(job.job_id, job.gpu_type, start, fit.domain, free_now))
        self.reservations.append(Reservation(job.job_id, fit.domain, start, fit.gpu_ids(self.ix)))
        self.estimated[job.job_id] = start
        self.reasons[job.job_id] = f"{base}; reserved {fit.domain}, earliest {reasons.relative(start - self.now)}"
        return True

    # ------------------------------------------------------------------ reasons

    def _shape_reason(self, job: PendingJob) -> str:
        key = (job.gpu_type, job.replicas, job.gpus_per_replica, self._one_leaf(job))
        if key not in self._reason_cache:
            self._reason_cache[key] = reasons.blocked(self.st, *key[:3], one_leaf=key[3])
        return self._reason_cache[key]

    def _blocked_reason(self, job: PendingJob) -> str:
        # Many queued jobs share a shape; the text only changes when GPUs or holds do.
        key = (
            job.gpu_type,
            job.replicas,
            job.gpus_per_replica,
            self._one_leaf(job),
            self.st.type_free.get(job.gpu_type, 0),
            self._held_version,
        )
        text = self._blocked_cache.get(key)
        if text is None:
            text = self._blocked_cache[key] = self._blocked_text(job)
        return text

    def _blocked_text(self, job: PendingJob) -> str:
        same_type = [h for h in self.held if h.gpu_type == job.gpu_type]
        if not same_type:
            return self._shape_reason(job)
        first = min(same_type, key=lambda h: (h.start, h.job_id))
        when = reasons.relative(first.start - self.now)
        behind = f"waiting behind a reservation for job {first.job_id} (starts {when} on {first.domain})"
        held_free = sum(len(h.free_now) for h in same_type)
        if held_free and self.st.type_free.get(job.gpu_type, 0) + held_free >= job.gpu_count:
            return f"{behind}; it would fit now only on GPUs held for that job"
        return f"{behind}; {self._shape_reason(job)}"


def _locs(gpu_loc: dict[str, Loc], replicas: tuple[tuple[str, ...], ...]) -> tuple[Loc, ...]:
    """(node index, position) of each GPU; GPUs the topology lacks (a removed node) are skipped."""
    try:
        return tuple([gpu_loc[g] for r in replicas for g in r])
    except KeyError:
        return tuple([gpu_loc[g] for r in replicas for g in r if g in gpu_loc])
