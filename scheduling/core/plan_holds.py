"""What a plan holds for a job that cannot start now: a reclaim's victims and reservation, a backfill
reservation, and the at-risk jobs a reservation due now preempts.
"""

from __future__ import annotations

from scheduling.core import atrisk, reasons
from scheduling.core.placement_fit import Fit
from scheduling.core.plan_state import Loc, PlanState, _Held
from scheduling.core.preemption import Reclaim, Reclaimer
from scheduling.core.types import PendingJob, Preemption, Reservation, RunningJob, Tier

# Read for every pending job: an enum member read is a class attribute lookup, so they are read once.
_PRODUCTION, _RESEARCH, _SPOT = Tier.PRODUCTION, Tier.RESEARCH, Tier.SPOT


class PlanHolds(PlanState):
    """The holds of ``plan._Planner``: reclaims (victims, then a reservation) and backfill reservations."""

    # False: every reclaim searches victims (the reference of tests/property/test_fast_paths.py).
    count_takeable = True

    # ------------------------------------------------------------------ reclaim

    def _may_preempt(self, job: PendingJob) -> bool:
        """Tier 1 and Tier 2 work within its team's guarantee (claimed in tier order) may preempt."""
        return job.tier <= _RESEARCH and self.quota.within_guarantee(job.team, job.gpu_type, job.gpu_count, job.tier)

    def _reclaim(self, job: PendingJob, one_leaf: bool, excess: dict[str, int] | None = None) -> bool:
        """Preempt for ``job``: victims that free a placement (none when it fits on free GPUs and only a
        limit stops it) and, for each unit of ``excess`` (unit -> GPUs beyond its limit with the job),
        victims under that unit until it is back under its limit."""
        key = (
            job.tier, job.team, job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf, job.one_fabric, job.one_per_node,
            job.needs,
        )  # fmt: skip
        if key in self._reclaim_fails:
            return False
        if self._reclaims >= self.cfg.max_reclaims:
            self._deferred.add(job.job_id)
            return False
        if not excess and self.count_takeable and self._takeable(job) == 0:
            # No running job is one it may take: the search over no candidates finds what the search over
            # all of them would (every victim it would look at is one it may not take), without building
            # them (every running job per node: a tenth of a cycle at 8,000 running jobs where the waiting
            # Tier 2 jobs of teams back under their guarantee could take none).
            if self._bare_reclaimer is None:
                self._bare_reclaimer = Reclaimer(self.ix, (), self.locs, self.borrowed, self.cfg, self.now, taken=self.victims)
                self._bare_reclaimer.claim((), set(self.reserved))
            reclaimer = self._bare_reclaimer
        else:
            if self._reclaimer is None:
                # Built at the first reclaim, it reads the plan's record of victims: those a due reservation
                # took before (``_due_at_risk``) are not offered again.
                self._reclaimer = Reclaimer(
                    self.ix, self.running, self.locs, self.borrowed, self.cfg, self.now, taken=self.victims
                )
                self._reclaimer.claim((), set(self.reserved))
            reclaimer = self._reclaimer
        free_fit = self._find(job, one_leaf) if excess else None
        found = Reclaim(free_fit, (), ()) if free_fit is not None else reclaimer.find(self.st, job, one_leaf=one_leaf)
        if found is None:
            self._reclaim_fails.add(key)  # no placement with every possible victim gone: the same for its shape
            return False
        waits_on: tuple[RunningJob, ...] = found.waits_on
        if excess:
            more = reclaimer.under_limits(job, excess, self.quota.chain, waits_on)
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

    def _takeable(self, job: PendingJob) -> int:
        """At most the GPUs of ``job``'s type that victims could give it: those of every running job of a
        class it may take (``victims.candidates``, ``victims.may_take``), counted once a plan."""
        if self._takeable_counts is None:
            anyone: dict[str, int] = {}  # terminating jobs, and Tier 3 past their minimum runtime
            borrowing: dict[str, int] = {}  # Tier 2 past it that borrow
            borrowing_of: dict[tuple[str, str], int] = {}  # the same, per team
            everyone: dict[str, int] = {}  # every candidate: what Tier 1 may take
            min_runtime, now = self.cfg.min_runtime_s, self.now
            for j in self.running:
                if not j.terminating and (j.tier == _PRODUCTION or now - j.start < min_runtime):
                    continue
                n = len(self.locs[j.job_id])
                t = j.gpu_type
                everyone[t] = everyone.get(t, 0) + n
                if j.terminating or j.tier == _SPOT:
                    anyone[t] = anyone.get(t, 0) + n
                elif self.borrowed.get(j.job_id):
                    borrowing[t] = borrowing.get(t, 0) + n
                    borrowing_of[(t, j.team)] = borrowing_of.get((t, j.team), 0) + n
            self._takeable_counts = (anyone, borrowing, borrowing_of, everyone)
        anyone, borrowing, borrowing_of, everyone = self._takeable_counts
        t = job.gpu_type
        if job.tier == _PRODUCTION:
            return everyone.get(t, 0)
        return anyone.get(t, 0) + borrowing.get(t, 0) - borrowing_of.get((t, job.team), 0)

    def _take(self, jobs: tuple[RunningJob, ...]) -> None:
        """Record jobs this plan preempts (or waits on, if terminating): not to be taken again by any path."""
        self.victims.update(j.job_id for j in jobs)
        for reclaimer in (self._reclaimer, self._bare_reclaimer):
            if jobs and reclaimer is not None:
                reclaimer.claim(jobs, set())  # the nodes their GPUs are on change for its caches

    def _hold(self, fit: Fit, job: PendingJob) -> set[Loc]:
        """Take a reservation's GPUs out of the pool, with the cores and memory the job will need on the
        free ones; return those that were free."""
        locs = {(ni, p) for ni, positions in fit.replicas for p in positions}
        self.reserved |= locs
        for reclaimer in (self._reclaimer, self._bare_reclaimer):
            if reclaimer is not None:
                reclaimer.claim((), locs)
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
