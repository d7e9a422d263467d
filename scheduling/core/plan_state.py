"""A plan's working state: the free pool, its searches, the running jobs' releases, the reasons given.

``PlanState`` is what ``plan._Planner`` builds from a snapshot and reads throughout a plan; the holds a
plan makes (reclaims, reservations) are in ``plan_holds``, the order and each job's path in ``plan``.
"""

from __future__ import annotations

import math
from bisect import insort
from dataclasses import dataclass, field
from operator import itemgetter

from scheduling.core import atrisk, reasons
from scheduling.core.backfill import Release, earliest_fit
from scheduling.core.free_state import FreeState
from scheduling.core.index import TopoIndex, running_locs, topo_index
from scheduling.core.locality import LeafChooser
from scheduling.core.placement import find_job
from scheduling.core.placement_fit import Fit, take_fit
from scheduling.core.placement_node import node_with_lent
from scheduling.core.preemption import Reclaimer
from scheduling.core.quota import QuotaState, borrowed_running
from scheduling.core.types import (
    PendingJob,
    Placement,
    Preemption,
    Reservation,
    Snapshot,
    Tier,
)

Loc = tuple[int, int]

_END_AND_ID = itemgetter(0, 1)  # a Release's (end, job_id), read in C: thousands of releases per reservation


@dataclass(slots=True)
class _Held:
    """A backfill reservation in this plan, and which of its GPUs are free now (held out of the pool)."""

    job_id: str
    gpu_type: str
    start: float
    domain: str
    free_now: set[Loc] = field(default_factory=set)
    name: str = ""


class PlanState:
    """One plan's state, from its snapshot: free GPUs, quotas, what is placed, held and reasoned."""

    lend_to_one_node = True  # see _find_before_reservations

    def __init__(self, snapshot: Snapshot, now: float) -> None:
        self.snap = snapshot
        self.now = now
        self.cfg = snapshot.config
        self.ix: TopoIndex = topo_index(snapshot.topology)
        self.running = tuple(sorted(snapshot.running, key=lambda j: j.job_id))
        # Each running job's GPUs as (node index, position), and the cores and memory each busy GPU
        # carries: computed once for every use below, and for the estimates of the same snapshot.
        found = running_locs(self.ix, snapshot.running)
        self.locs = found.locs
        self.st = FreeState(self.ix, (loc for locs in self.locs.values() for loc in locs), found.held)
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
        self._bare_reclaimer: Reclaimer | None = None  # over no candidates: for preemptors that may take none
        # GPUs per type that victims could give a preemptor (``PlanHolds._takeable``), counted at the first reclaim.
        self._takeable_counts: tuple[dict[str, int], dict[str, int], dict[tuple[str, str], int], dict[str, int]] | None = None
        self._reclaims = 0  # preemptors so far (Config.max_reclaims)
        self._deferred: set[str] = set()  # jobs that could not preempt: the plan's reclaims were spent
        # Free GPUs only shrink while planning, so a shape that failed keeps failing:
        # (type, per replica, one leaf only, cores, memory, one fabric domain only) -> the fewest replicas
        # known not to fit.
        self._fails: dict[tuple[str, int, bool, int, int, bool, bool, frozenset[str]], int] = {}
        self._reclaim_fails: set[tuple[Tier, str, str, int, int, bool, bool, bool, frozenset[str]]] = set()
        self._reason_cache: dict[tuple[str, int, int, bool, int, int, bool, bool, frozenset[str]], str] = {}
        self._never: dict[tuple[str, int, int, int, int, bool], str | None] = {}
        self._blocked_cache: dict[tuple[str, int, int, bool, int, int, int, int, bool, bool, frozenset[str]], str] = {}
        self._held_version = 0  # bumped whenever a backfill reservation's held GPUs change
        self._strict_block: dict[str, str] = {}  # backfill off: type -> first blocked job
        self._lend_fails: dict[tuple[str, int, bool, int, int, bool, bool, tuple[str, ...], frozenset[str]], int] = {}
        # How many pending jobs searched the free pool, and how many the failed-shape cache spared
        # (bench/core_plan.py prints both, so a reader sees how much of a plan's work is real).
        self.searches = 0
        self.cache_hits = 0

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
            job.one_per_node, job.needs,
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
            job.one_fabric, job.one_per_node, tuple(h.job_id for h in usable), job.needs,
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

    # ------------------------------------------------------------------ releases

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
        # The placed part only grows: the jobs placed since the last call go into a copy of its list, each
        # by bisection (ends and ids are unique pairs, so a Release's own order is the (end, id) order);
        # sorting every release again for each call was a tenth of a saturated 4x plan.
        last = self._rel_cache
        if last is not None and last[0][0] == key[0] and last[0][1] <= key[1]:
            merged, since = list(last[1]), last[0][1]
        else:
            merged, since = list(self._run_rel[1]), 0
        for job, fit in self.placed_fits[since:]:
            locs = tuple([(ni, p) for ni, positions in fit.replicas for p in positions])
            insort(merged, Release(self.now + job.time_limit, job.job_id, locs))
        self._rel_cache = (key, merged)
        return merged

    # ------------------------------------------------------------------ reasons

    def _shape_reason(self, job: PendingJob, one_leaf: bool) -> str:
        key = (
            job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf, job.cpus_per_replica, job.memory_mb_per_replica,
            job.one_fabric, job.one_per_node, job.needs,
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
            job.needs,
        )
        text = self._blocked_cache.get(key)
        if text is None:
            text = self._blocked_cache[key] = self._needs_reason(job, self._blocked_text(job, one_leaf))
        return text

    def _needs_reason(self, job: PendingJob, text: str) -> str:
        """``text``, said after what a job that needs node capabilities is short of when some nodes of its
        GPU type that take work lack them (``reasons.needs``), or that alone when none has them."""
        allowed = self.ix.allowed_for(job.needs)
        if allowed is None:
            return text
        nodes = [ni for ni in self.ix.type_nodes.get(job.gpu_type, ()) if self.ix.nodes[ni].schedulable]
        have = sum(1 for ni in nodes if ni in allowed)
        if have == len(nodes):
            return text
        note = reasons.needs(job.needs, have=have, of=len(nodes), gpu_type=job.gpu_type)
        return note if have == 0 else f"{note}; {text}"

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
