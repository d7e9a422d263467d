"""The scheduler's one entry point: ``plan(snapshot, now=...) -> Plan``.

Its state and searches are in ``plan_state``, the holds it makes (reclaims, reservations) in ``plan_holds``;
this module orders the pending jobs and takes each down its path.
"""

from __future__ import annotations

import gc
import math

from scheduling.core import atrisk, reasons
from scheduling.core.fairshare import team_order
from scheduling.core.plan_holds import PlanHolds
from scheduling.core.types import (
    PendingJob,
    Plan,
    PlanError,
    RunningJob,
    Snapshot,
    id_order,
)

_UNSEEN = "unseen"  # sentinel of the never-runnable cache (its values are None or a reason)


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


class _Planner(PlanHolds):
    _starving: str | None = None  # the oldest pending job past Config.aged_reservation_s, if any

    # ------------------------------------------------------------------ main loop

    def run(self) -> Plan:
        if self.cfg.aged_reservation_s != math.inf:  # off by default (docs/scheduler-core.md, Aging): no scan
            aged_at = self.now - self.cfg.aged_reservation_s
            aged = [j for j in self.snap.pending if j.submit_time <= aged_at]
            self._starving = min(aged, key=lambda j: (j.submit_time, id_order(j.job_id))).job_id if aged else None
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
        # Aged jobs (waited ``Config.age_first_s`` since submit) form one group ahead of every team of their
        # tier and in-guarantee/borrowing kind, in the teams' own order (priority, submit time, id).
        aged_at = self.now - self.cfg.age_first_s
        groups: dict[tuple[int, bool, int, str], list[PendingJob]] = {}
        for j in in_team_order:
            if j.submit_time <= aged_at:
                group = (j.tier, j.job_id not in in_guarantee, -1, "")
            else:
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
        may_hold = len(self.held) < self.cfg.max_reservations or job.job_id == self._starving
        if self.cfg.backfill and may_hold and self._reserve(job, one_leaf):
            return
        self.reasons[job.job_id] = self._blocked_reason(job, one_leaf)
