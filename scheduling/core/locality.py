"""Leaf locality decided by cost: wait for one leaf switch, or span leaves now?

A multi-node gang that one leaf's READY nodes could hold runs best under one leaf: across leaves its
all-reduce crosses the spine for its whole run, which makes it slower (``Config.span_slowdown``, the
deployment's estimate: 0.25 is 25 % more run time). Waiting for a leaf costs the wait. So, per job
(``PendingJob.locality``):

* ``required``: one leaf or wait, however long (Slurm's ``--switches=1``, Kueue's required topology);
* ``preferred``: one leaf if one has room now, else span at once (Kueue's preferred topology);
* ``auto`` (the default): when no leaf has room now but the gang could start across leaves, it waits
  only while the wait it expects for one leaf (the earliest start of a one-leaf placement, found as
  reservations are, from running jobs' time limits) is less than what spanning would cost it
  (``span_slowdown`` x its time limit, the run time it expects). When it cannot start either way, it
  waits for whichever finishes it sooner: one leaf at its earliest start, or leaves at theirs plus the
  slowdown.

``span_slowdown = inf`` makes every ``auto`` gang ``required``, 0 makes it ``preferred``: the
deployment's setting and the job's field are one rule. ``Config.leaf_wait_s`` bounds any wait for a
leaf since submit. Every waiting gang's pending reason says which was chosen and why (``notes``).
Fresh searches for expected starts are capped per plan (``Config.max_leaf_searches``); a gang past the
cap waits for one leaf this cycle and weighs again at the next (its reason says so).

Pure: the planner passes its searches in; the same plan state gives the same choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from typing import TypeVar

from scheduling.core import reasons
from scheduling.core.index import TopoIndex
from scheduling.core.placement import keep_in_leaf
from scheduling.core.types import Config, LeafLocality, PendingJob

F = TypeVar("F")


def _span(seconds: float) -> str:
    """A duration in the words of ``reasons.relative``, without its "in ~": "2 h 10 min"."""
    return reasons.relative(seconds).removeprefix("in ~") if seconds > 0 else "nothing"


class LeafChooser:
    """The locality decisions of one plan, and the note each waiting gang's reason gets."""

    def __init__(self, ix: TopoIndex, config: Config, now: float) -> None:
        self.ix = ix
        self.cfg = config
        self.now = now
        self.notes: dict[str, str] = {}
        # (type, replicas, per replica, one leaf) -> (plan version, earliest start or None): searches of
        # the same shape in an unchanged plan state give the same answer (many gangs share a shape).
        self.searches = 0  # fresh searches so far (Config.max_leaf_searches)
        # The third item: exact (False: a bound, "not before").
        self._starts: dict[tuple[str, int, int, bool, frozenset[str]], tuple[Hashable, float | None, bool]] = {}

    def first_one_leaf(self, job: PendingJob) -> bool:
        """Whether ``job``'s search starts under one leaf only (``placement.keep_in_leaf``); notes why."""
        if job.replicas <= 1 or job.replicas > self.ix.leaf_replicas_capacity(job.gpu_type, job.gpus_per_replica):
            return False  # one node, or no leaf could ever hold it: nothing to choose
        one = keep_in_leaf(self.ix, job, self.cfg, self.now)
        if self.now - job.submit_time >= self.cfg.leaf_wait_s:
            self.notes[job.job_id] = f"; any leaves: it has waited past the {_span(self.cfg.leaf_wait_s)} limit for one leaf"
        elif job.locality == LeafLocality.REQUIRED:
            self.notes[job.job_id] = "; one leaf switch: required by the job"
        elif not one:
            self.notes[job.job_id] = f"; any leaves ({job.locality.value}: no wait for one leaf)"
        elif self.cfg.span_slowdown == math.inf:
            self.notes[job.job_id] = "; one leaf switch: spanning leaves is set to cost more than any wait"
        return one

    def weighs(self, job: PendingJob) -> bool:
        """Whether ``job``, kept to one leaf by ``first_one_leaf``, may still span when that costs less."""
        return job.locality == LeafLocality.AUTO and self.cfg.span_slowdown != math.inf

    def choose(
        self,
        job: PendingJob,
        *,
        span_now: Callable[[], F | None],
        earliest: Callable[[bool, float], float | None],
        version: Hashable,
        binding: bool = True,
    ) -> tuple[bool, F | None]:
        """For an ``auto`` gang that no leaf has room for now: (one leaf?, the spanning fit to place now).

        ``span_now()`` is the placement across leaves on the GPUs free now (None: none); ``earliest(one_leaf, until)``
        the earliest start of a placement under one leaf / across leaves (None: never); ``version`` names the
        plan state they are computed on (the earliest starts are cached per shape and version); ``binding``:
        whether a choice made while it cannot start now binds anything (it gets a reservation).
        """
        cost = self.cfg.span_slowdown * job.time_limit
        share = f"{100 * self.cfg.span_slowdown:.0f} % of its {_span(job.time_limit)} limit"
        fit = span_now()
        if fit is not None:
            if not self._answered(job, True, version, self.now + cost):
                self.notes[job.job_id] = (
                    "; one leaf switch (auto) this cycle: it weighs a leaf against spanning at the next "
                    f"(at most {self.cfg.max_leaf_searches} gangs do in one cycle)"
                )
                return True, None
            leaf = self._start(job, True, earliest, version, enough=self.now + cost)
            wait = math.inf if leaf is None else max(leaf - self.now, 0.0)
            if wait < cost:
                self.notes[job.job_id] = (
                    f"; one leaf switch (auto): one is expected {reasons.relative(wait)}, "
                    f"sooner than spanning now would cost (~{_span(cost)}, {share})"
                )
                return True, None
            return False, fit
        if not binding:
            # Not the job a reservation is made for: it starts nowhere this cycle, and its choice would
            # bind nothing (the next cycle chooses again), so the two searches are not made for it.
            self.notes[job.job_id] = (
                "; one leaf switch or leaves (auto): whichever finishes it sooner, chosen when it is next in line"
            )
            return True, None
        if not (self._answered(job, True, version, math.inf) and self._answered(job, False, version, math.inf)):
            self.notes[job.job_id] = (
                "; one leaf switch (auto) this cycle: it weighs a leaf against spanning at the next "
                f"(at most {self.cfg.max_leaf_searches} gangs do in one cycle)"
            )
            return True, None
        leaf = self._start(job, True, earliest, version)
        spread = self._start(job, False, earliest, version)
        if spread is None or (leaf is not None and leaf - spread < cost):
            if leaf is not None:
                also = "" if spread is None else f"; leaves {reasons.relative(spread - self.now)} would cost ~{_span(cost)} more"
                self.notes[job.job_id] = f"; one leaf switch (auto): expected {reasons.relative(leaf - self.now)}{also}"
            return True, None
        one = "never" if leaf is None else reasons.relative(leaf - self.now)
        self.notes[job.job_id] = (
            f"; any leaves (auto): expected {reasons.relative(spread - self.now)}, one leaf {one}, "
            f"later by more than spanning would cost (~{_span(cost)}, {share})"
        )
        return False, None

    def reclaim_across(
        self,
        job: PendingJob,
        *,
        start: float,
        earliest: Callable[[bool, float], float | None],
        version: Hashable,
    ) -> str | None:
        """For an ``auto`` gang that may preempt but cannot free room in one leaf: whether preempting across
        leaves, to start at ``start`` (its victims' grace), finishes it sooner than waiting for one leaf.
        Returns the note its reason gets if it does (the caller sets it once the preemption is made), else
        None.

        ``choose`` weighs the starts running jobs' time limits give; preempting gives a spanning start of
        its own, often much sooner, so a gang that waits for a leaf is weighed again against it. Past the
        plan's search cap it keeps to one leaf this cycle (its reason says so, as ``choose``'s does).
        """
        cost = self.cfg.span_slowdown * job.time_limit
        enough = start + cost
        if not self._answered(job, True, version, enough):
            return None
        leaf = self._start(job, True, earliest, version, enough=enough)
        if leaf is not None and leaf - start < cost:
            return None  # the leaf's note from ``choose`` stands: it comes sooner than spanning would cost
        one = "not sooner" if leaf is None or leaf >= enough else reasons.relative(leaf - self.now)
        share = f"{100 * self.cfg.span_slowdown:.0f} % of its {_span(job.time_limit)} limit"
        return (
            f"; any leaves (auto): no leaf has room even with its victims gone, one leaf expected {one}, "
            f"later by more than spanning would cost (~{_span(cost)}, {share})"
        )

    def _cached(self, job: PendingJob, one_leaf: bool, version: Hashable, enough: float) -> tuple[bool, float | None]:
        """(True, start) where an answer found earlier in this plan decides; (False, None) where a search must."""
        hit = self._starts.get((job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf, job.needs))
        if hit is not None:
            seen, start, exact = hit
            if exact and start is None:
                return True, None  # never, even with every running job gone: only less is free later
            if start is not None and (start >= enough or (exact and seen == version)):
                return True, start
        return False, None

    def _answered(self, job: PendingJob, one_leaf: bool, version: Hashable, enough: float) -> bool:
        """Whether the start is known or a fresh search is within the plan's budget."""
        return self._cached(job, one_leaf, version, enough)[0] or self.searches < self.cfg.max_leaf_searches

    def _start(
        self,
        job: PendingJob,
        one_leaf: bool,
        earliest: Callable[[bool, float], float | None],
        version: Hashable,
        *,
        enough: float = math.inf,
    ) -> float | None:
        """The earliest start of this shape, searched again only when the plan state changed; ``enough``:
        a start at or after it decides as well as the exact one, and a cached start, from an earlier
        state, is never later than the exact one (free GPUs only shrink while planning), so it answers."""
        key = (job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf, job.needs)
        known, start = self._cached(job, one_leaf, version, enough)
        if known:
            return start
        self.searches += 1
        # Ends at or after ``enough`` cannot change the choice: they are not replayed, and a start not
        # found before it is kept as "not before ``enough``" (a bound, which answers later asks as well).
        start = earliest(one_leaf, enough)
        if start is None and enough != math.inf:
            self._starts[key] = (version, enough, False)
            return enough
        self._starts[key] = (version, start, True)
        return start
