"""The scheduler's one entry point: ``plan(snapshot, now=...) -> Plan``."""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass, field
from operator import itemgetter

from scheduling.core import atrisk, reasons
from scheduling.core.backfill import Release, earliest_fit
from scheduling.core.fairshare import team_order
from scheduling.core.index import FreeState, TopoIndex, carried, topo_index
from scheduling.core.locality import LeafChooser
from scheduling.core.placement import Fit, find_job, node_with_lent, take_fit
from scheduling.core.preemption import Reclaim, Reclaimer
from scheduling.core.quota import QuotaState, borrowed_running
from scheduling.core.types import (
    PendingJob,
    Placement,
    Plan,
    PlanError,
    Preemption,
    Reservation,
    RunningJob,
    Snapshot,
    Tier,
    id_order,
)

Loc = tuple[int, int]
# Read for every pending job: an enum member read is a class attribute lookup, so they are read once.
_PRODUCTION, _RESEARCH = Tier.PRODUCTION, Tier.RESEARCH
_UNSEEN = "unseen"  # sentinel of the never-runnable cache (its values are None or a reason)
_END_AND_ID = itemgetter(0, 1)  # a Release's (end, job_id), read in C: thousands of releases per reservation


def plan(snapshot: Snapshot, *, now: float) -> Plan:
    """Decide what starts, what is preempted and what is reserved, for one scheduling cycle.

    Contract:
    - Pure and deterministic: no clock, no I/O, no randomness; the same snapshot and ``now``
      give the same plan, whatever the order of the snapshot's tuples.
    - Pending jobs are taken in order: Tier 1, 2, 3; within a tier, work within its team's
      guarantee before work that would borrow, then teams in hierarchical fair-share order
      (``fairshare.team_order``); within a team, priority (high first), then submit time,
      then job_id (``types.id_order``: numbers as numbers).
    - A team's guarantee is claimed in tier order (``quota``): a job of tier k is within it when
      the team's work of tiers 1..k, the job included, fits.
    - A gang is placed whole or not at all, in the lowest topology domain that holds it,
      best fit (``placement.find``), on GPUs free of running jobs, of this plan's
      placements and of reservations; never beyond a limit of its team or an ancestor;
      Tier 1 only within its team's guarantee (its Tier 1 work). ``Placement.borrowed`` marks
      what runs beyond the team's guarantee.
    - A multi-node gang that the READY nodes of one leaf switch could hold is placed under
      one leaf when one has room. Otherwise, by its ``locality`` (``locality.LeafChooser``):
      ``required`` waits for one leaf (reserving the leaf where it fits earliest; reclaim
      looks for a one-leaf placement too), ``preferred`` spans, ``auto`` waits only while the
      wait it expects is less than spanning would cost (``Config.span_slowdown`` x its time
      limit); none waits past ``Config.leaf_wait_s``. Its pending reason says which and why.
    - With ``Config.backfill_at_risk``, a Tier 2/3 job may start on a reservation's free GPUs
      even if it would outlive it (``Placement.at_risk``); a running at-risk job never delays a
      reservation, and is preempted, whatever its run time, when the reservation comes due
      (``atrisk``).
    - A Tier 1 job, or a Tier 2 job within its team's guarantee, that does not fit, or that
      would pass a limit of its team or an ancestor, may preempt (``preemption.Reclaimer``): the
      victims free a placement and bring every such unit back under its limit. It then holds a
      reservation on the GPUs it will use, which nobody else gets in this plan. Tier 1 and
      terminating jobs, and jobs younger than ``Config.min_runtime_s``, are never victims.
    - The first jobs in order that cannot start (up to ``Config.max_reservations``) get a
      reservation at their earliest start; later jobs start only on GPUs outside every
      reservation, or inside one if they end (by their time limit) before it starts.
    - Every pending job not placed gets a reason in ``Plan.pending_reasons``.
    - Each job is named once: a victim is preempted by one path only (a due reservation, a reclaim,
      a reclaim across leaves all read one record of the plan's victims), a job is placed once, and
      none is both; checked before the plan is returned (``check_once``; ``PlanError`` otherwise).
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


def check_once(result: Plan, running: tuple[RunningJob, ...]) -> None:
    """``result`` names each job once: a victim is preempted once and is running (not stopping), a job is
    placed once, and none is both placed and preempted. A plan that breaks this is a bug of the planner:
    ``PlanError``, rather than two stop orders for one job. One pass over the jobs."""
    stoppable = {j.job_id for j in running if not j.terminating}
    preempted: dict[str, str | None] = {}
    for pre in result.preemptions:
        job_id = pre.job_id
        if job_id in preempted:
            raise PlanError(f"the plan preempts job {job_id} twice (for job {preempted[job_id]} and for job {pre.for_job})")
        if job_id not in stoppable:
            raise PlanError(f"the plan preempts job {job_id}, which is not running or already stopping")
        preempted[job_id] = pre.for_job
    placed: set[str] = set()
    for p in result.placements:
        if p.job_id in placed:
            raise PlanError(f"the plan places job {p.job_id} twice")
        if p.job_id in preempted:
            raise PlanError(f"the plan places job {p.job_id} and preempts it")
        placed.add(p.job_id)


@dataclass(slots=True)
class _Held:
    """A backfill reservation in this plan, and which of its GPUs are free now (held out of the pool)."""

    job_id: str
    gpu_type: str
    start: float
    domain: str
    free_now: set[Loc] = field(default_factory=set)
    name: str = ""


class _Planner:
    lend_to_one_node = True  # see _find_before_reservations

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snap = snapshot
        self.now = now
        self.cfg = snapshot.config
        self.ix: TopoIndex = topo_index(snapshot.topology)
        self.running = tuple(sorted(snapshot.running, key=lambda j: j.job_id))
        gpu_loc = self.ix.gpu_loc
        # Each running job's GPUs as (node index, position), computed once for every use below.
        self.locs = {j.job_id: _locs(gpu_loc, j.replicas) for j in self.running}
        held: dict[Loc, tuple[int, int]] = {}  # the cores and memory each busy GPU carries
        if self.ix.limited:
            for j in self.running:
                carried(held, gpu_loc, j.replicas, j.cpus_per_replica, j.memory_mb_per_replica)
        self.st = FreeState(self.ix, (loc for locs in self.locs.values() for loc in locs), held)
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
        # Every job this plan preempts or waits on (terminating ones): the one record that every path that
        # preempts reads and writes through ``_take`` (a due reservation's at-risk jobs, reclaim, reclaim
        # across leaves), shared with the Reclaimer, so that no job is taken twice.
        self.victims: set[str] = set()
        self.leaf = LeafChooser(self.ix, self.cfg, now)
        self.lent_at_risk: set[str] = set()  # jobs this plan starts at risk on reserved GPUs
        self._run_rel: tuple[int, list[Release]] | None = None  # (victims, running jobs' releases)
        self._run_base: tuple[int, list[Release]] | None = None  # the same before any victim
        self._rel_cache: tuple[tuple[int, int], list[Release]] | None = None
        self._reclaimer: Reclaimer | None = None
        self._reclaims = 0  # preemptors so far (Config.max_reclaims)
        self._deferred: set[str] = set()  # jobs that could not preempt: the plan's reclaims were spent
        # Free GPUs only shrink while planning, so a shape that failed keeps failing:
        # (type, per replica, one leaf only, cores, memory, one fabric domain only) -> the fewest replicas
        # known not to fit.
        self._fails: dict[tuple[str, int, bool, int, int, bool, bool], int] = {}
        self._reclaim_fails: set[tuple[Tier, str, str, int, int, bool, bool, bool]] = set()
        self._reason_cache: dict[tuple[str, int, int, bool, int, int, bool, bool], str] = {}
        self._never: dict[tuple[str, int, int, int, int, bool], str | None] = {}
        self._blocked_cache: dict[tuple[str, int, int, bool, int, int, int, int, bool, bool], str] = {}
        self._held_version = 0  # bumped whenever a backfill reservation's held GPUs change
        self._strict_block: dict[str, str] = {}  # backfill off: type -> first blocked job
        self._lend_fails: dict[tuple[str, int, bool, int, int, bool, bool, tuple[str, ...]], int] = {}
        # How many pending jobs searched the free pool, and how many the failed-shape cache spared
        # (bench/core_plan.py prints both, so a reader sees how much of a plan's work is real).
        self.searches = 0
        self.cache_hits = 0

    # ------------------------------------------------------------------ main loop

    def run(self) -> Plan:
        for job in self._ordered():
            self._one(job)
        for job_id in self._deferred:
            if job_id in self.reasons:
                self.reasons[job_id] += (
                    f"; may preempt at the next cycle (at most {self.cfg.max_reclaims} jobs preempt in one cycle)"
                )
        for job_id, note in self.leaf.notes.items():
            if job_id in self.reasons and not self.reasons[job_id].startswith("can never run"):
                self.reasons[job_id] += note
        result = Plan(
            placements=tuple(self.placements),
            preemptions=tuple(self.preemptions),
            reservations=tuple(self.reservations),
            pending_reasons=self.reasons,
            estimated_start=self.estimated,
            borrowed=self.borrowed,
        )
        check_once(result, self.running)
        return result

    def _ordered(self) -> list[PendingJob]:
        """Tier; then work within its team's guarantee before work that would borrow; then fair share;
        then priority, submit time, job id.

        Guaranteed work goes first inside a tier so that a reclaim is not undone by the next cycle:
        the GPUs a preemptor freed would otherwise go to a borrower ranked above it by fair share,
        and it would preempt again.
        """
        rank = team_order(self.snap.quotas, self.ix.share_capacity())
        last = len(rank)

        def within_team(j: PendingJob) -> tuple[int, int, float, tuple[int, int, str]]:
            # Ids as numbers, not text: "10" after "9", and the preview's "new" after both, as the
            # job it stands for will be (a tie on submit time must not order a preview apart).
            return (j.tier, -j.priority, j.submit_time, id_order(j.job_id))

        # A team's jobs use its guarantee in the team's own order; the first that would not fit borrows.
        in_guarantee: set[str] = set()
        queued: dict[tuple[str, str], int] = {}
        in_team_order = sorted(self.snap.pending, key=within_team)
        for j in in_team_order:
            key = (j.team, j.gpu_type)
            queued[key] = queued.get(key, 0) + j.gpu_count
            if self.quota.within_guarantee(j.team, j.gpu_type, queued[key], j.tier):
                in_guarantee.add(j.job_id)
        # The order is (tier, borrows, fair-share rank, team, then the team's own order). The jobs, already
        # in their team's order, are dealt into one group per (tier, borrows, rank, team), keeping that
        # order, and the groups are taken in key order: the order a stable sort on the whole key gives
        # (inside a group its ties are the team's order, which is the rest of the key), without sorting
        # every job again on a seven-field key. Submit times are numbers (a NaN would order nothing).
        groups: dict[tuple[int, bool, int, str], list[PendingJob]] = {}
        for j in in_team_order:
            group = (j.tier, j.job_id not in in_guarantee, rank.get(j.team, last), j.team)
            members = groups.get(group)
            if members is None:
                groups[group] = [j]
            else:
                members.append(j)
        return [j for group in sorted(groups) for j in groups[group]]

    def _one(self, job: PendingJob) -> None:
        t, r, g = job.gpu_type, job.replicas, job.gpus_per_replica
        c, m, f = job.cpus_per_replica, job.memory_mb_per_replica, job.one_fabric
        shape = (t, r, g, c, m, f)
        impossible = self._never.get(shape, _UNSEEN)
        if impossible is _UNSEEN:
            impossible = self._never[shape] = (
                reasons.never(self.ix, t, r, g, cpus=c, memory_mb=m, one_fabric=f) if r > 0 and g > 0 else "asks for no GPUs"
            )
        if impossible is not None:
            self.reasons[job.job_id] = f"can never run: {impossible}"
            return
        over = self.quota.blocked(job)
        if over is not None:
            # Over a limit of its team or an ancestor: a job that may preempt takes victims under those
            # units (its own team's lower-tier work, other teams' borrowed work), else it waits.
            may = self.cfg.preemption and t not in self._strict_block and self._may_preempt(job)
            excess = self.quota.excess(job) if may else None
            if not excess or not self._reclaim(job, r > 1 and not f and self._one_leaf(job), excess):
                self.reasons[job.job_id] = over
                self.leaf.notes.pop(job.job_id, None)  # it waits on quota, whatever its locality
            return
        if t in self._strict_block:
            self.reasons[job.job_id] = f"waiting behind job {self._strict_block[t]} (strict order: backfill is off)"
            return
        # The leaf rule depends only on the job and now: decided once, passed to every search below
        # (and never binds one replica, which cannot span nodes). A gang kept to one fabric domain is in
        # one leaf wherever it goes (a fabric domain lies under one leaf): no leaf rule to weigh.
        one_leaf = r > 1 and not f and self._one_leaf(job)
        fit = self._find(job, one_leaf)
        if fit is None and self.held:
            fit = self._find_before_reservations(job, one_leaf)
        if fit is None and one_leaf and self.leaf.weighs(job):
            # No leaf has room: span now, or wait for a leaf, by what each would cost this gang.
            one_leaf, fit = self.leaf.choose(
                job,
                span_now=lambda: self._find(job, False),
                earliest=lambda one, until: self._earliest(job, one, until),
                version=self._version(),
                binding=self.cfg.backfill and len(self.held) < self.cfg.max_reservations,
            )
            if fit is None and not one_leaf and self.held:
                fit = self._find_before_reservations(job, False)
        if fit is None and self.held and atrisk.may_lend(job, self.cfg):
            fit = self._find_before_reservations(job, one_leaf, at_risk=True)
        if fit is not None:
            self._place(job, fit)
            return
        if self.cfg.preemption and self._may_preempt(job):
            if self._reclaim(job, one_leaf):
                return
            if one_leaf and self.leaf.weighs(job):
                note = self.leaf.reclaim_across(
                    job,
                    start=self.now + self.cfg.grace_period_s,
                    earliest=lambda one, until: self._earliest(job, one, until),
                    version=self._version(),
                )
                if note is not None and self._reclaim(job, False):
                    self.leaf.notes[job.job_id] = note
                    return
        if not self.cfg.backfill:
            self._strict_block[t] = job.job_id
        if self.cfg.backfill and len(self.held) < self.cfg.max_reservations and self._reserve(job, one_leaf):
            return
        self.reasons[job.job_id] = self._blocked_reason(job, one_leaf)

    # ------------------------------------------------------------------ placement

    def _one_leaf(self, job: PendingJob) -> bool:
        return self.leaf.first_one_leaf(job)

    def _version(self) -> tuple[int, int, int, int]:
        """Names the plan's state for the locality cache: every change of free or held GPUs changes it."""
        return (len(self.placements), self._held_version, len(self.reservations), len(self.victims))

    def _earliest_fit(self, job: PendingJob, one_leaf: bool, until: float = math.inf) -> tuple[float, Fit] | None:
        """When and where ``job`` could start at the earliest, on this plan's state (``backfill.earliest_fit``)."""
        rel = self._releases()
        return earliest_fit(self.st, rel, self.reserved, job, one_leaf=one_leaf, until=until)

    def _earliest(self, job: PendingJob, one_leaf: bool, until: float = math.inf) -> float | None:
        """When ``job`` could start at the earliest (under one leaf, or anywhere), as a reservation would;
        None: never, or not before ``until``."""
        found = self._earliest_fit(job, one_leaf, until)
        return None if found is None else found[0]

    def _find(self, job: PendingJob, one_leaf: bool) -> Fit | None:
        key = (
            job.gpu_type, job.gpus_per_replica, one_leaf, job.cpus_per_replica, job.memory_mb_per_replica, job.one_fabric,
            job.one_per_node,
        )  # fmt: skip
        failed = self._fails.get(key)
        r = job.replicas
        if failed is not None and r >= failed:
            self.cache_hits += 1
            return None
        self.searches += 1
        fit = find_job(self.st, job, one_leaf=one_leaf)
        if fit is None:
            self._fails[key] = min(r, failed) if failed is not None else r
        return fit

    def _find_before_reservations(self, job: PendingJob, one_leaf: bool, *, at_risk: bool = False) -> Fit | None:
        """EASY backfill: a job that ends before a reservation starts may use its free GPUs meanwhile;
        ``at_risk``: any reservation's, and the job is marked at risk if it uses one it would outlive."""
        end = self.now + job.time_limit
        usable = [h for h in self.held if (at_risk or end <= h.start) and h.free_now]
        if not usable:
            return None
        # The pool (free GPUs plus those lent) only shrinks too, so failures are cached as in _find.
        key = (
            job.gpu_type, job.gpus_per_replica, one_leaf, job.cpus_per_replica, job.memory_mb_per_replica,
            job.one_fabric, job.one_per_node, tuple(h.job_id for h in usable),
        )  # fmt: skip
        failed = self._lend_fails.get(key)
        if failed is not None and job.replicas >= failed:
            return None
        pool = {loc for h in usable for loc in h.free_now}
        if (
            job.replicas == 1
            and self.lend_to_one_node
            and self.st.exact_for(
                job.gpu_type, job.gpus_per_replica, cpus=job.cpus_per_replica, memory_mb=job.memory_mb_per_replica
            )
        ):
            # The job's own search of the pool has just failed (or a job of its shape had, and the pool
            # only shrinks): no domain of its type has room, so only a node holding lent GPUs can take it.
            # The node whose domain the search would pick is found from counts (``node_with_lent``), and
            # only its lent GPUs are lent: the search sees the same best domain and returns the same fit.
            # Lending all of a reservation's free GPUs (hundreds) for every such job was a sixth of a plan.
            # ``lend_to_one_node = False`` runs the lend-everything reference (tests/property).
            ni = node_with_lent(self.st, job.gpu_type, job.gpus_per_replica, pool)
            lent = sorted(loc for loc in pool if loc[0] == ni)
        else:
            lent = sorted(pool)
        self.st.give_locs(lent)
        fit = find_job(self.st, job, one_leaf=one_leaf) if lent else None
        if fit is None:
            self._lend_fails[key] = min(job.replicas, failed) if failed is not None else job.replicas
        used = {(ni, p) for ni, positions in fit.replicas for p in positions} if fit else set()
        self.st.take_locs(loc for loc in lent if loc not in used)
        if at_risk and any(end > h.start and not used.isdisjoint(h.free_now) for h in usable):
            self.lent_at_risk.add(job.job_id)
        if used:
            for h in usable:
                h.free_now -= used
            self._held_version += 1
        return fit

    def _place(self, job: PendingJob, fit: Fit) -> None:
        borrowed = self.quota.would_borrow(job.team, job.gpu_type, job.gpu_count, job.tier)
        take_fit(self.st, fit, job.cpus_per_replica, job.memory_mb_per_replica)
        self.quota.add(job.team, job.gpu_type, job.gpu_count, job.tier)
        at_risk = job.job_id in self.lent_at_risk
        self.placements.append(fit.placement(self.ix, job.job_id, borrowed=borrowed, at_risk=at_risk))
        self.placed_fits.append((job, fit))

    # ------------------------------------------------------------------ reclaim

    def _may_preempt(self, job: PendingJob) -> bool:
        """Tier 1 and Tier 2 work within its team's guarantee (claimed in tier order) may preempt."""
        return job.tier <= _RESEARCH and self.quota.within_guarantee(job.team, job.gpu_type, job.gpu_count, job.tier)

    def _reclaim(self, job: PendingJob, one_leaf: bool, excess: dict[str, int] | None = None) -> bool:
        """Preempt for ``job``: victims that free a placement (none when it fits on free GPUs and only a
        limit stops it) and, for each unit of ``excess`` (unit -> GPUs beyond its limit with the job),
        victims under that unit until it is back under its limit."""
        key = (job.tier, job.team, job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf, job.one_fabric, job.one_per_node)
        if key in self._reclaim_fails:
            return False
        if self._reclaims >= self.cfg.max_reclaims:
            self._deferred.add(job.job_id)
            return False
        if self._reclaimer is None:
            # Built at the first reclaim, it reads the plan's record of victims: those a due reservation
            # took before (``_due_at_risk``) are not offered again.
            self._reclaimer = Reclaimer(self.ix, self.running, self.locs, self.borrowed, self.cfg, self.now, taken=self.victims)
            self._reclaimer.claim((), set(self.reserved))
        free_fit = self._find(job, one_leaf) if excess else None
        found = Reclaim(free_fit, (), ()) if free_fit is not None else self._reclaimer.find(self.st, job, one_leaf=one_leaf)
        if found is None:
            self._reclaim_fails.add(key)  # no placement with every possible victim gone: the same for its shape
            return False
        waits_on: tuple[RunningJob, ...] = found.waits_on
        if excess:
            more = self._reclaimer.under_limits(job, excess, self.quota.chain, waits_on)
            if more is None:
                return False
            waits_on = (*waits_on, *more)
        victims = [j for j in waits_on if not j.terminating]
        self._reclaims += 1
        start = self.now + self.cfg.grace_period_s
        why = (
            f"preempted for Tier 1 job {reasons.job_label(job.job_id, job.name)}"
            if job.tier == Tier.PRODUCTION
            else f"reclaimed for job {reasons.job_label(job.job_id, job.name)} (team {job.team} within guarantee)"
        )
        for victim in victims:
            self.preemptions.append(
                Preemption(job_id=victim.job_id, reason=why, grace_s=self.cfg.grace_period_s, for_job=job.job_id)
            )
        self._take(waits_on)
        self._hold(found.fit, job)
        self.quota.add(job.team, job.gpu_type, job.gpu_count, job.tier)
        self.reservations.append(Reservation(job.job_id, found.fit.domain, start, found.fit.gpu_ids(self.ix)))
        self.estimated[job.job_id] = start
        to = f"free {found.fit.domain}" if found.waits_on else ""
        if excess:
            units = " and ".join(f"{'team' if u == job.team else 'unit'} {u}" for u in self.quota.chain(job.team) if u in excess)
            under = f"bring {units} back under {'its' if len(excess) == 1 else 'their'} {job.gpu_type} limit"
            to = f"{to} and {under}" if to else f"{under} ({found.fit.domain} held for it)"
        when = reasons.relative(start - self.now)
        if victims:
            names = ", ".join(v.job_id for v in victims)
            self.reasons[job.job_id] = f"preempting {len(victims)} job(s) ({names}) to {to}; starts {when}"
        else:
            names = ", ".join(v.job_id for v in waits_on)
            self.reasons[job.job_id] = f"waiting for stopping job(s) {names} to {to}; starts {when}"
        return True

    def _take(self, jobs: tuple[RunningJob, ...]) -> None:
        """Record jobs this plan preempts (or waits on, if terminating): not to be taken again by any path."""
        self.victims.update(j.job_id for j in jobs)
        if jobs and self._reclaimer is not None:
            self._reclaimer.claim(jobs, set())  # the nodes their GPUs are on change for its caches

    def _hold(self, fit: Fit, job: PendingJob) -> set[Loc]:
        """Take a reservation's GPUs out of the pool, with the cores and memory the job will need on the
        free ones; return those that were free."""
        locs = {(ni, p) for ni, positions in fit.replicas for p in positions}
        self.reserved |= locs
        if self._reclaimer is not None:
            self._reclaimer.claim((), locs)
        st = self.st
        free_now = {loc for loc in locs if st.free[loc[0]][loc[1]]}
        if self.ix.limited and free_now:
            for ni, positions in fit.replicas:
                free = [p for p in positions if st.free[ni][p]]
                share = len(free) / len(positions)
                st.carry(ni, free, round(job.cpus_per_replica * share), round(job.memory_mb_per_replica * share))
        self.st.take_locs(sorted(free_now))
        return free_now

    # ------------------------------------------------------------------ reservations

    def _releases(self) -> list[Release]:
        # Asked for every reservation and every locality choice (locality.py): the running jobs' part
        # changes only with the victims, the placed part only grows, so both are kept between calls.
        key = (len(self.victims), len(self.placed_fits))
        if self._rel_cache is not None and self._rel_cache[0] == key:
            return self._rel_cache[1]
        grace_end = self.now + self.cfg.grace_period_s
        if self._run_base is None:
            base: list[Release] = []
            for j in self.running:
                end = j.start + j.time_limit
                # An at-risk job is stopped when a reservation needs its GPUs: it delays none (``atrisk``).
                if j.terminating or atrisk.lent(j):
                    end = min(end, grace_end)
                base.append(Release(max(end, self.now), j.job_id, self.locs[j.job_id]))
            base.sort(key=_END_AND_ID)
            self._run_base = self._run_rel = (0, base)
        if self._run_rel is None or self._run_rel[0] != key[0]:
            # A victim ends with its grace period: its release moves there, the rest keep their order.
            victims, now = self.victims, self.now
            kept = [r for r in self._run_base[1] if r.job_id not in victims]
            moved = [r._replace(end=max(min(r.end, grace_end), now)) for r in self._run_base[1] if r.job_id in victims]
            out = kept + moved
            out.sort(key=_END_AND_ID)
            self._run_rel = (key[0], out)
        placed = [
            Release(self.now + job.time_limit, job.job_id, tuple([(ni, p) for ni, positions in fit.replicas for p in positions]))
            for job, fit in self.placed_fits
        ]
        # Two sorted runs: Timsort merges them in C, several times faster than heapq.merge's Python loop.
        merged = self._run_rel[1] + placed if placed else self._run_rel[1]
        if placed:
            merged.sort(key=_END_AND_ID)
        self._rel_cache = (key, merged)
        return merged

    def _reserve(self, job: PendingJob, one_leaf: bool) -> bool:
        found = self._earliest_fit(job, one_leaf)
        if found is None:
            return False
        start, fit = found
        base = self._shape_reason(job, one_leaf)  # before the hold changes what is free
        due = self._due_at_risk(job, start, fit)
        free_now = self._hold(fit, job)
        self._held_version += 1
        self.held.append(_Held(job.job_id, job.gpu_type, start, fit.domain, free_now, job.name))
        self.reservations.append(Reservation(job.job_id, fit.domain, start, fit.gpu_ids(self.ix)))
        self.estimated[job.job_id] = start
        self.reasons[job.job_id] = f"{base}; reserved {fit.domain}, earliest {reasons.relative(start - self.now)}{due}"
        return True

    def _due_at_risk(self, job: PendingJob, start: float, fit: Fit) -> str:
        """A reservation due within the grace period preempts the at-risk jobs on its GPUs (``atrisk``)."""
        if start > self.now + self.cfg.grace_period_s:
            return ""
        used = {(ni, p) for ni, positions in fit.replicas for p in positions}
        due = atrisk.due_victims(used, self.running, self.locs, self.victims)
        for victim in due:
            self.preemptions.append(
                Preemption(victim.job_id, atrisk.reason(job.job_id), grace_s=self.cfg.grace_period_s, for_job=job.job_id)
            )
        self._take(tuple(due))
        return f" (preempting at-risk job(s) {', '.join(j.job_id for j in due)})" if due else ""

    # ------------------------------------------------------------------ reasons

    def _shape_reason(self, job: PendingJob, one_leaf: bool) -> str:
        key = (
            job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf, job.cpus_per_replica, job.memory_mb_per_replica,
            job.one_fabric, job.one_per_node,
        )  # fmt: skip
        if key not in self._reason_cache:
            self._reason_cache[key] = reasons.blocked(
                self.st,
                *key[:3],
                one_leaf=one_leaf,
                cpus=job.cpus_per_replica,
                memory_mb=job.memory_mb_per_replica,
                one_fabric=job.one_fabric,
            )
        return self._reason_cache[key]

    def _blocked_reason(self, job: PendingJob, one_leaf: bool) -> str:
        # Many queued jobs share a shape; the text only changes when GPUs or holds do.
        key = (
            job.gpu_type,
            job.replicas,
            job.gpus_per_replica,
            one_leaf,
            self.st.type_free.get(job.gpu_type, 0),
            self._held_version,
            job.cpus_per_replica,
            job.memory_mb_per_replica,
            job.one_fabric,
            job.one_per_node,
        )
        text = self._blocked_cache.get(key)
        if text is None:
            text = self._blocked_cache[key] = self._blocked_text(job, one_leaf)
        return text

    def _blocked_text(self, job: PendingJob, one_leaf: bool) -> str:
        same_type = [h for h in self.held if h.gpu_type == job.gpu_type]
        if not same_type:
            return self._shape_reason(job, one_leaf)
        first = min(same_type, key=lambda h: (h.start, h.job_id))
        when = reasons.relative(first.start - self.now)
        label = reasons.job_label(first.job_id, first.name)
        behind = f"waiting behind a reservation for job {label} (starts {when} on {first.domain})"
        held_free = sum(len(h.free_now) for h in same_type)
        if held_free and self.st.type_free.get(job.gpu_type, 0) + held_free >= job.gpu_count:
            return f"{behind}; it would fit now only on GPUs held for that job"
        return f"{behind}; {self._shape_reason(job, one_leaf)}"


def _locs(gpu_loc: dict[str, Loc], replicas: tuple[tuple[str, ...], ...]) -> tuple[Loc, ...]:
    """(node index, position) of each GPU; GPUs the topology lacks (a removed node) are skipped."""
    try:
        return tuple([gpu_loc[g] for r in replicas for g in r])
    except KeyError:
        return tuple([gpu_loc[g] for r in replicas for g in r if g in gpu_loc])
