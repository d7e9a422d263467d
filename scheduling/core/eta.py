"""Estimated starts for every job a plan leaves waiting, not only the reserved ones.

``plan`` gives an earliest start only to the jobs it reserves for (EASY backfill reserves one). A person
whose job waits for its team's quota, behind a reservation, or for a leaf switch to drain still asks
"when?". This module answers from the same snapshot and plan, by the rule the reservations use: every
running job ends at the latest at its start + time limit (a terminating one within the grace period),
every job the plan placed or reserved for runs its whole time limit from its start, and nothing else
changes meanwhile.

* **Capacity.** The earliest release after which the gang fits (``backfill.earliest_fit``) in the free
  GPUs the plan leaves, with every reservation's GPUs held until its job would end.
* **Quota.** For each unit of the job's chain whose limit blocks it (and, for Tier 1, the team's
  guarantee), the earliest release after which the unit holds few enough GPUs for the job. The unit's
  GPUs are those of the running jobs, placements and reservations of its teams.
* The estimate is the later of the two: feasibility only grows as jobs end, so that is the first moment
  both hold in this model.

It is an *earliest* start: jobs ahead in the queue may take what frees up first, and jobs usually end
before their time limit. Slurm's backfill computes its expected start times by the same rule.

Pure: no Django, no I/O, no clock; deterministic for a given snapshot, plan and ``now``.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from itertools import accumulate
from operator import itemgetter

from scheduling.core import admission, reasons
from scheduling.core.backfill import Release, earliest_fit
from scheduling.core.eta_running import RunningPart, _Holding, running_part
from scheduling.core.free_state import FreeState
from scheduling.core.index import RunningLocs, TopoIndex, carried, running_locs, topo_index
from scheduling.core.placement import keep_in_leaf
from scheduling.core.plan import plan
from scheduling.core.quota import QuotaState
from scheduling.core.types import PendingJob, Plan, RunningJob, Snapshot, Tier, Verdict

Loc = tuple[int, int]
NEVER_PREFIX = "can never run"
_END = itemgetter(0)  # a Release's end
_END_AND_ID = itemgetter(0, 1)
_BY_END = itemgetter(4, 0)  # a _Holding's (end, job_id)
_H_END = itemgetter(4)  # a _Holding's end


@dataclass(frozen=True, slots=True)
class Estimate:
    """When a waiting job could start at the earliest, and the job whose end lets it (None: it already could)."""

    start: float
    after_job: str | None


def start_estimates(snapshot: Snapshot, result: Plan, *, now: float) -> dict[str, Estimate]:
    """An estimate for every pending job that ``result`` (``plan(snapshot, now=now)``) left waiting and
    that can ever run; a reservation's own earliest start is kept as it is."""
    return Estimator().estimates(snapshot, result, now=now)


class Estimator:
    """``start_estimates`` across cycles, for a caller that asks at every cycle (the Celery cycle).

    The model of the cluster (``_Model``: the free state, the ends replayed, each unit's holdings) and
    each job shape's earliest fit are kept while what they read is unchanged: the running jobs' GPUs,
    teams, tiers, starts, time limits and stop orders, the plan's placements, reservations and victims
    with their jobs, the quota tree's guarantees and limits, the topology and the config. A new pending
    job then costs its own shape once; a cycle where nothing changed costs the comparison.

    Time moves on meanwhile. Until the first end the model has not passed, every end it clamped to its
    ``now`` stays clamped and every other end stays ahead, so each kept estimate, moved up to the new
    ``now`` where it was earlier, is what a fresh model gives (``_Model.valid_at``). Past that end, or
    where an end hangs on ``now`` itself (a stop's grace period, this plan's placements), a kept
    estimate is at most the time elapsed since the build early (every end moves by at most that much,
    and none moves earlier): the model is kept for ``keep_s`` seconds at most then, and rebuilt after.
    tests/property/test_eta_cache.py holds both. ``keep_s`` 0 (the default): exact, always.
    """

    def __init__(self, *, keep_s: float = 0.0) -> None:
        self.keep_s = keep_s
        self._model: _Model | None = None
        self._key: tuple[object, ...] | None = None
        self.builds = 0  # models built so far (tests and bench/cycle.py read it)

    def estimates(self, snapshot: Snapshot, result: Plan, *, now: float) -> dict[str, Estimate]:
        waiting = [j for j in snapshot.pending if j.job_id in result.pending_reasons]
        if not waiting:
            return {}
        model = self._model_for(snapshot, result, now)
        out: dict[str, Estimate] = {}
        for job in waiting:
            if result.pending_reasons[job.job_id].startswith(NEVER_PREFIX):
                continue
            reserved = result.estimated_start.get(job.job_id)
            if reserved is not None:
                out[job.job_id] = Estimate(reserved, None)
                continue
            found = model.estimate(job)
            if found is not None:
                out[job.job_id] = found
        return out

    def with_estimates(self, snapshot: Snapshot, result: Plan, *, now: float) -> Plan:
        """``with_estimates`` from this estimator's kept model."""
        return _with(snapshot, result, self.estimates(snapshot, result, now=now))

    def _model_for(self, snapshot: Snapshot, result: Plan, now: float) -> _Model:
        key = _model_key(snapshot, result)
        model = self._model
        if model is not None and key == self._key and (model.valid_at(now) or model.built <= now <= model.built + self.keep_s):
            model.now = now
            return model
        self._model, self._key = _Model(snapshot, result, now), key
        self.builds += 1
        return self._model


def _model_key(snapshot: Snapshot, result: Plan) -> tuple[object, ...]:
    """What ``_Model`` reads of the snapshot and the plan, but ``now`` (``_Model.valid_at``) and what
    changes every cycle without changing an estimate (a checkpoint, decayed usage, the queue's order)."""
    pending = {j.job_id: j for j in snapshot.pending}

    def job(job_id: str) -> tuple[object, ...] | None:
        j = pending.get(job_id)
        if j is None:
            return None
        return (j.team, j.tier, j.gpu_type, j.gpu_count, j.time_limit, j.cpus_per_replica, j.memory_mb_per_replica)

    return (
        snapshot.topology,
        snapshot.config,
        [_running_key(j) for j in snapshot.running],
        [(p.job_id, p.replicas, job(p.job_id)) for p in result.placements],
        [(r.job_id, r.gpus, r.earliest_start, job(r.job_id)) for r in result.reservations],
        [p.job_id for p in result.preemptions],
        [(u.name, u.parent, u.guaranteed, u.limit) for u in snapshot.quotas],
    )


def _running_key(j: RunningJob) -> tuple[object, ...]:
    return (
        j.job_id,
        j.team,
        j.tier,
        j.gpu_type,
        j.replicas,
        j.start,
        j.time_limit,
        j.terminating,
        j.cpus_per_replica,
        j.memory_mb_per_replica,
    )


def with_estimates(snapshot: Snapshot, result: Plan, *, now: float) -> Plan:
    """``result`` with an estimated start for every waiting job that can run (``start_estimates``), and
    the job whose end it waits for named in the reason of a quota wait.

    The cycle writes this plan's ``estimated_start`` and ``pending_reasons``, and the admission preview
    (``admit``) reads the same, so the portal, the API and the preview give one number.
    """
    return _with(snapshot, result, start_estimates(snapshot, result, now=now))


def _with(snapshot: Snapshot, result: Plan, estimates: Mapping[str, Estimate]) -> Plan:
    reasons_out = dict(result.pending_reasons)
    names: dict[str, str] | None = None
    for job_id, estimate in estimates.items():
        why = reasons_out[job_id]
        if estimate.after_job is not None and _is_quota_wait(why) and "when job" not in why:
            if names is None:
                names = {r.job_id: r.name for r in snapshot.running}
            after = reasons.job_label(estimate.after_job, names.get(estimate.after_job, ""))
            reasons_out[job_id] = f"{why}; frees up when job {after} ends"
    return replace(
        result,
        estimated_start={**result.estimated_start, **{k: e.start for k, e in estimates.items()}},
        pending_reasons=reasons_out,
    )


def admit(snapshot: Snapshot, job: PendingJob, *, now: float) -> Verdict:
    """``admission.admit`` with an estimate for every kind of wait (the submit page's and the API's preview)."""
    never = admission._never(snapshot, job)
    if never is not None:
        return Verdict(ok=False, reason=never)
    queued = replace(snapshot, pending=(*(p for p in snapshot.pending if p.job_id != job.job_id), job))
    result = with_estimates(queued, plan(queued, now=now), now=now)
    for placement in result.placements:
        if placement.job_id == job.job_id:
            return Verdict(ok=True, reason=admission._fits_now(snapshot, placement))
    why = result.pending_reasons.get(job.job_id, "waits for free GPUs")
    start = result.estimated_start.get(job.job_id)
    if start is not None:
        return Verdict(ok=True, reason=f"waits {wait_words(start - now)}: {why}")
    return Verdict(ok=True, reason=f"waits: {why}")


def wait_words(seconds: float) -> str:
    """'~40 min', '~2 h 10 min', or 'a moment' (the wording of the preview's "waits ~2 h: ...")."""
    text = reasons.relative(seconds)
    return "a moment" if text == "now" else text.removeprefix("in ")


def _is_quota_wait(reason: str) -> bool:
    return reason.startswith(("over team", "over parent unit", "Tier 1 runs only within guarantee"))


class _Model:
    """The cluster as the plan leaves it: what is busy, until when, and what each team holds.

    The running jobs are read from their ``RunningPart`` (``eta_running``: kept from the last model and
    changed by the jobs that ended or started since), with ``now`` and the plan laid over it; ``whole``
    (or a snapshot that names one job twice) reads them one by one (``_whole``, the reference the
    tests hold the other to)."""

    def __init__(self, snapshot: Snapshot, result: Plan, now: float, *, whole: bool = False) -> None:
        self.snap, self.now, self.cfg = snapshot, now, snapshot.config
        self.built = now
        self.ix: TopoIndex = topo_index(snapshot.topology)
        self.quota = QuotaState(snapshot.quotas, ())
        # The running jobs' GPUs as the plan of the same snapshot found them (``running_locs``).
        found = running_locs(self.ix, snapshot.running)
        part = None
        if not whole and self.cfg.grace_period_s >= 0:
            part = running_part(self.ix, snapshot.quotas, self.quota, snapshot.running, found.locs)
        # The first end after ``now`` (``valid_at``), and whether an end hangs on ``now`` itself.
        self.horizon = math.inf
        self.now_bound = bool(result.placements)
        # (unit, type) -> its holdings by (end, job id): all of them (``_whole``), or those asked for so
        # far (``_over``: made from the part's on demand, ``holdings``).
        self._by_unit: dict[tuple[str, str], list[_Holding]] = {}
        self._part: RunningPart | None = part
        self._overlay: dict[tuple[str, str], list[_Holding]] = {}
        self._moved: dict[str, float] = {}
        if part is None:
            self._whole(snapshot, result, found)
        else:
            self._over(part, snapshot, result, found)
        # shape -> (the end after which it fits, the first job ending then), or None: never.
        self._fits: dict[tuple[str, int, int, bool, int, int, bool, bool, frozenset[str]], tuple[float, str] | None] = {}
        # (unit, type, tier) -> the unit's holdings of tiers 1..tier by end time, and the GPUs their ends
        # free so far (a running sum): built once, read by every pending job of the unit (``_room``).
        self._runs: dict[tuple[str, str, int], tuple[list[_Holding], list[int]]] = {}

    def _whole(self, snapshot: Snapshot, result: Plan, found: RunningLocs) -> None:
        now = self.now
        loc = self.ix.gpu_loc
        pending = {j.job_id: j for j in snapshot.pending}
        grace_end = now + self.cfg.grace_period_s
        victims = {p.job_id for p in result.preemptions}
        reserved_locs: set[Loc] = {loc[g] for r in result.reservations for g in r.gpus if g in loc}
        busy: list[Loc] = []
        held: dict[Loc, tuple[int, int]] = dict(found.held)
        releases: list[Release] = []
        holdings: list[_Holding] = []
        for j in snapshot.running:
            end = j.start + j.time_limit
            if (j.terminating or j.job_id in victims) and grace_end < end:
                end = grace_end
                self.now_bound = True
            if end > now:
                if end < self.horizon:
                    self.horizon = end
            else:
                end = now
            mine = found.locs[j.job_id]
            busy.extend(mine)
            # A reserved GPU is not free when its current job ends: the reservation's job takes it then.
            if reserved_locs and not reserved_locs.isdisjoint(mine):
                mine = tuple([x for x in mine if x not in reserved_locs])
            releases.append(Release(end, j.job_id, mine))
            holdings.append(_holding_of(j, end))
        planned, planned_holdings = self._planned(result, pending, reserved_locs, busy, held)
        releases.extend(planned)
        holdings.extend(planned_holdings)
        releases.sort(key=_END_AND_ID)
        self.releases = releases
        self.free = FreeState(self.ix, busy, held)
        for h in sorted(holdings, key=_BY_END):
            for unit in self.quota.chain(h.team):
                self._by_unit.setdefault((unit, h.gpu_type), []).append(h)

    def _over(self, part: RunningPart, snapshot: Snapshot, result: Plan, found: RunningLocs) -> None:
        """What ``_whole`` builds, from ``part``: the ends at or before ``now`` are ``now`` (sorted by job
        id then), a stop's end is its grace period's end, a reserved GPU is not given back by its current
        job's end, and the plan's placements and reservations are added."""
        now = self.now
        loc = self.ix.gpu_loc
        jobs = part.jobs
        pending = {j.job_id: j for j in snapshot.pending}
        grace_end = now + self.cfg.grace_period_s
        reserved_locs: set[Loc] = {loc[g] for r in result.reservations for g in r.gpus if g in loc}
        moved = self._moved
        for job_id in (*part.terminating, *(p.job_id for p in result.preemptions)):
            j = jobs.get(job_id)
            if j is not None and grace_end < j.start + j.time_limit:
                moved[job_id] = grace_end
        if moved:
            self.now_bound = True
        if not reserved_locs:
            cut_locs: set[str] = set()
        elif part.owner is not None:
            cut_locs = {part.owner[x] for x in reserved_locs if x in part.owner}
        else:
            cut_locs = {j.job_id for j in snapshot.running if not reserved_locs.isdisjoint(found.locs[j.job_id])}

        def mine(job_id: str, locs: tuple[Loc, ...]) -> tuple[Loc, ...]:
            return tuple([x for x in locs if x not in reserved_locs]) if job_id in cut_locs else locs

        base = part.releases
        cut = bisect_right(base, now, key=_END)
        releases = sorted([Release(now, r.job_id, mine(r.job_id, r.locs)) for r in base[:cut]], key=_END_AND_ID)
        rest = base[cut:]
        adds: list[Release] = []
        for job_id in sorted(moved.keys() | cut_locs):
            j = jobs[job_id]
            raw = j.start + j.time_limit
            if raw <= now:
                continue  # (among the first, cut there: a stop's grace period cannot end before ``now``)
            del rest[bisect_left(rest, (raw, job_id), key=_END_AND_ID)]
            end = moved.get(job_id, raw)
            if end > now:
                self.horizon = min(self.horizon, end)
            else:
                end = now
            adds.append(Release(end, job_id, mine(job_id, found.locs[job_id])))
        if rest:
            self.horizon = min(self.horizon, rest[0].end)
        releases.extend(rest)
        busy: list[Loc] = [x for locs in found.locs.values() for x in locs]
        held: dict[Loc, tuple[int, int]] = dict(found.held)
        overlay = self._overlay
        for job_id, end in moved.items():
            h = _holding_of(jobs[job_id], end)
            for unit in self.quota.chain(h.team):
                overlay.setdefault((unit, h.gpu_type), []).append(h)
        planned, planned_holdings = self._planned(result, pending, reserved_locs, busy, held)
        adds.extend(planned)
        for h in planned_holdings:
            for unit in self.quota.chain(h.team):
                overlay.setdefault((unit, h.gpu_type), []).append(h)
        for add in adds:  # (after equal keys: the order a stable sort of running, placed, reserved gives)
            insort(releases, add, key=_END_AND_ID)
        self.releases = releases
        self.free = FreeState(self.ix, busy, held)

    def _planned(
        self,
        result: Plan,
        pending: Mapping[str, PendingJob],
        reserved_locs: set[Loc],
        busy: list[Loc],
        held: dict[Loc, tuple[int, int]],
    ) -> tuple[list[Release], list[_Holding]]:
        """The plan's placements (from ``now``) and reservations (from their start), each for its time
        limit: their releases and holdings; their GPUs added to ``busy`` (and a placement's cores and
        memory to ``held``), a reservation's end to the horizon."""
        loc, now = self.ix.gpu_loc, self.now
        releases: list[Release] = []
        holdings: list[_Holding] = []
        for p in result.placements:
            job = pending.get(p.job_id)
            locs = _locs(loc, (g for r in p.replicas for g in r))
            end = now + (job.time_limit if job is not None else 0.0)
            busy.extend(locs)
            if job is not None and self.ix.limited:
                carried(held, loc, p.replicas, job.cpus_per_replica, job.memory_mb_per_replica)
            releases.append(Release(end, p.job_id, tuple(x for x in locs if x not in reserved_locs)))
            if job is not None:
                holdings.append(_Holding(p.job_id, job.team, job.gpu_type, job.gpu_count, end, job.tier))
        for r in result.reservations:
            job = pending.get(r.job_id)
            end = r.earliest_start + (job.time_limit if job is not None else 0.0)
            locs = _locs(loc, r.gpus)
            busy.extend(locs)
            releases.append(Release(end, r.job_id, tuple(locs)))
            if now < end < self.horizon:
                self.horizon = end
            if job is not None:
                holdings.append(_Holding(r.job_id, job.team, job.gpu_type, job.gpu_count, end, job.tier))
        return releases, holdings

    def holdings(self, key: tuple[str, str]) -> list[_Holding]:
        """What the unit ``key[0]`` holds of type ``key[1]`` (its teams' running jobs, placements and
        reservations), by (end, job id), each end as ``_whole`` sets it."""
        got = self._by_unit.get(key)
        if got is not None or self._part is None:
            return got or []
        base = self._part.by_unit.get(key, [])
        now, moved = self.now, self._moved
        cut = bisect_right(base, now, key=_H_END)
        out = sorted([h._replace(end=now) for h in base[:cut]], key=_BY_END)
        out.extend([h for h in base[cut:] if h.job_id not in moved] if moved else base[cut:])
        for h in self._overlay.get(key, ()):
            insort(out, h, key=_BY_END)
        self._by_unit[key] = out
        return out

    def unit_keys(self) -> list[tuple[str, str]]:
        """Every (unit, type) that holds something."""
        if self._part is None:
            return sorted(self._by_unit)
        return sorted(k for k in {*self._part.by_unit, *self._overlay} if self.holdings(k))

    def valid_at(self, now: float) -> bool:
        """Whether this model, built at ``self.built``, answers as one built at ``now`` would (once its
        ``now`` is set to it): no end lies between the two, and no end was set from the old ``now``."""
        return now == self.built or (not self.now_bound and self.built <= now < self.horizon)

    def estimate(self, job: PendingJob) -> Estimate | None:
        capacity = self._capacity(job)
        if capacity is None:
            return None
        quota = self._quota(job)
        if quota is None:
            return None
        return max(capacity, quota, key=lambda e: (e.start, e.after_job is not None))

    def _capacity(self, job: PendingJob) -> Estimate | None:
        one_leaf = job.replicas > 1 and not job.one_fabric and keep_in_leaf(self.ix, job, self.cfg, self.now)
        key = (
            job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf, job.cpus_per_replica, job.memory_mb_per_replica,
            job.one_fabric, job.one_per_node, job.needs,
        )  # fmt: skip
        if key not in self._fits:
            found = earliest_fit(self.free, self.releases, set(), job, one_leaf=one_leaf, when_only=True)
            if found is None:
                self._fits[key] = None
            else:
                at = bisect_left(self.releases, found[0], key=_END)
                self._fits[key] = (found[0], self.releases[at].job_id)
        fit = self._fits[key]
        if fit is None:
            return None
        # Kept from a model built at an earlier ``now`` (``Estimator``): an end it had clamped to that
        # ``now`` is the new ``now``, and no end lies between the two.
        start = max(fit[0], self.now)
        return Estimate(start, fit[1] if start > self.now else None)

    def _quota(self, job: PendingJob) -> Estimate | None:
        """The earliest moment every unit of the job's chain has room for it (never: None)."""
        if job.team not in self.quota.units:
            return None
        t, n = job.gpu_type, job.gpu_count
        caps: list[tuple[str, int, int]] = [(u, lim, Tier.SPOT) for u, lim, _ in self.quota.limits(job.team, t)]
        if job.tier == Tier.PRODUCTION:
            # The guarantee is claimed in tier order (quota.py): only the team's Tier 1 work stands before it.
            caps.append((job.team, self.quota.guaranteed(job.team, t), Tier.PRODUCTION))
        best = Estimate(self.now, None)
        for unit, cap, tier in caps:
            found = self._room(unit, t, n, cap, tier)
            if found is None:
                return None
            if found.start > best.start:
                best = found
        return best

    def _room(self, unit: str, gpu_type: str, need: int, cap: int, tier: int) -> Estimate | None:
        """The earliest moment the unit's holdings of jobs of tiers 1..``tier`` leave ``need`` under ``cap``.

        The first holding (by end) whose end frees enough: with ``freed[i]`` the GPUs the first i + 1 ends
        free, the first i where ``held - freed[i] + need <= cap``; ``freed`` never falls, so a bisection
        finds it (a walk per pending job was 0.5 s a cycle at 8,000 running jobs and 500 pending).
        """
        run = self._runs.get((unit, gpu_type, tier))
        if run is None:
            holdings = [h for h in self.holdings((unit, gpu_type)) if h.tier <= tier]
            run = self._runs[(unit, gpu_type, tier)] = (holdings, list(accumulate(h.gpus for h in holdings)))
        holdings, freed = run
        held = freed[-1] if freed else 0
        if held + need <= cap:
            return Estimate(self.now, None)
        i = bisect_left(freed, held + need - cap)
        if i == len(holdings):
            return None  # more than the cap even with the unit empty: admission refuses such a job
        h = holdings[i]
        return Estimate(max(h.end, self.now), h.job_id)


def _holding_of(j: RunningJob, end: float) -> _Holding:
    return _Holding(j.job_id, j.team, j.gpu_type, sum(map(len, j.replicas)), end, j.tier)


def _locs(gpu_loc: Mapping[str, Loc], ids: Iterable[str]) -> list[Loc]:
    return [gpu_loc[g] for g in ids if g in gpu_loc]
