"""The running jobs' part of the estimated starts' model, kept from one cycle to the next.

``eta._Model`` reads every running job at every cycle that changes anything: its release (its GPUs come
free at start + time limit) and its holding in each unit of its team's chain, both in end order. At 8,000
running jobs that was 25 ms of a cycle in which 16 jobs ended and 16 started. What of it does not depend
on ``now`` or on the plan (the ends before either clamps or cuts them, all GPUs, the holdings) is a
``RunningPart``, and the next one is the last one less the jobs that are gone and plus the jobs that came
(a job is the same while it is the same object: ``selectors.snapshot._running`` keeps a job whose row
and GPUs have not changed). ``eta._Model`` lays ``now`` and the plan over it; ``_Model.fresh`` is the
model built whole, the reference tests/property/test_eta_running.py holds the two to.

A part is never changed once made (the web process's threads build models of the same running jobs for
their previews at once): the next one copies what it changes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from scheduling.core.backfill import Release
from scheduling.core.index import Loc, TopoIndex
from scheduling.core.quota import QuotaState
from scheduling.core.types import QuotaUnit, RunningJob

_END_AND_ID = itemgetter(0, 1)  # a Release's (end, job_id)
_BY_END = itemgetter(4, 0)  # a _Holding's (end, job_id)

# Past this many jobs gone and come (besides a quarter of them all), a part is built whole: sorting once
# is cheaper than as many insertions.
_MOST_CHANGES = 256


class _Holding(NamedTuple):
    """GPUs of one type that a team holds (or will hold) until ``end``."""

    job_id: str
    team: str
    gpu_type: str
    gpus: int
    end: float
    tier: int = 3


@dataclass(frozen=True, slots=True)
class RunningPart:
    """Running jobs as a model reads them before ``now`` and the plan: each one's release at its own end
    (start + time limit) with all its GPUs, and its holding in each unit of its team's chain, both sorted
    by (end, job id); the job on each busy GPU (None where two jobs name one GPU)."""

    ix: TopoIndex
    tree: tuple[tuple[str, str | None], ...]  # (unit, parent): what the chains read
    running: tuple[RunningJob, ...]
    jobs: Mapping[str, RunningJob]
    releases: list[Release]
    by_unit: Mapping[tuple[str, str], list[_Holding]]
    owner: Mapping[Loc, str] | None
    terminating: frozenset[str]  # jobs told to stop


_LAST: list[RunningPart] = []


def running_part(
    ix: TopoIndex,
    quotas: tuple[QuotaUnit, ...],
    quota: QuotaState,
    running: tuple[RunningJob, ...],
    locs: Mapping[str, tuple[Loc, ...]],
) -> RunningPart | None:
    """The part of ``running`` (``locs``: ``index.running_locs``'s), from the last one where it can be;
    None where two running jobs share an id (only the model built whole reads such a snapshot)."""
    tree = tuple((u.name, u.parent) for u in quotas)
    last = _LAST[0] if _LAST else None
    if last is not None and last.running is running and last.ix is ix and last.tree == tree:
        return last
    jobs = {j.job_id: j for j in running}
    if len(jobs) != len(running):
        return None
    if last is None or last.ix is not ix or last.tree != tree:
        part = _whole(ix, tree, quota, running, jobs, locs)
    else:
        part = _changed(last, tree, quota, running, jobs, locs)
    _LAST[:] = [part]
    return part


def _end(j: RunningJob) -> float:
    return j.start + j.time_limit


def _holding(j: RunningJob) -> _Holding:
    return _Holding(j.job_id, j.team, j.gpu_type, sum(map(len, j.replicas)), j.start + j.time_limit, j.tier)


def _whole(
    ix: TopoIndex,
    tree: tuple[tuple[str, str | None], ...],
    quota: QuotaState,
    running: tuple[RunningJob, ...],
    jobs: dict[str, RunningJob],
    locs: Mapping[str, tuple[Loc, ...]],
) -> RunningPart:
    releases = sorted((Release(j.start + j.time_limit, j.job_id, locs[j.job_id]) for j in running), key=_END_AND_ID)
    by_unit: dict[tuple[str, str], list[_Holding]] = {}
    for h in sorted(map(_holding, running), key=_BY_END):
        for unit in quota.chain(h.team):
            by_unit.setdefault((unit, h.gpu_type), []).append(h)
    terminating = frozenset(j.job_id for j in running if j.terminating)
    return RunningPart(ix, tree, running, jobs, releases, by_unit, _owners(running, locs), terminating)


def _owners(running: tuple[RunningJob, ...], locs: Mapping[str, tuple[Loc, ...]]) -> dict[Loc, str] | None:
    owner: dict[Loc, str] = {}
    for j in running:
        for loc in locs[j.job_id]:
            if owner.setdefault(loc, j.job_id) != j.job_id:
                return None
    return owner


def _changed(
    last: RunningPart,
    tree: tuple[tuple[str, str | None], ...],
    quota: QuotaState,
    running: tuple[RunningJob, ...],
    jobs: dict[str, RunningJob],
    locs: Mapping[str, tuple[Loc, ...]],
) -> RunningPart:
    before = last.jobs
    gone = [j for job_id, j in before.items() if jobs.get(job_id) is not j]
    came = [j for job_id, j in jobs.items() if before.get(job_id) is not j]
    if len(gone) + len(came) > _MOST_CHANGES + len(running) // 4:
        return _whole(last.ix, tree, quota, running, jobs, locs)
    releases = last.releases.copy()
    by_unit = dict(last.by_unit)
    copied: set[tuple[str, str]] = set()

    def unit_list(key: tuple[str, str]) -> list[_Holding]:
        if key not in copied:
            copied.add(key)
            by_unit[key] = by_unit.get(key, []).copy()
        return by_unit[key]

    owner = dict(last.owner) if last.owner is not None else None
    for j in gone:
        end = _end(j)
        at = bisect_left(releases, (end, j.job_id), key=_END_AND_ID)
        if at == len(releases) or releases[at].job_id != j.job_id:
            return _whole(last.ix, tree, quota, running, jobs, locs)  # (an end that does not compare: NaN)
        if owner is not None:
            for loc in releases[at].locs:
                if owner.get(loc) == j.job_id:
                    del owner[loc]
        del releases[at]
        for unit in quota.chain(j.team):
            held = unit_list((unit, j.gpu_type))
            del held[bisect_left(held, (end, j.job_id), key=_BY_END)]
    for j in came:
        mine = locs[j.job_id]
        insort(releases, Release(_end(j), j.job_id, mine), key=_END_AND_ID)
        h = _holding(j)
        for unit in quota.chain(j.team):
            insort(unit_list((unit, j.gpu_type)), h, key=_BY_END)
        if owner is not None:
            for loc in mine:
                if owner.setdefault(loc, j.job_id) != j.job_id:
                    owner = None
                    break
    if owner is None and last.owner is None:
        owner = _owners(running, locs)  # (two jobs named one GPU last time: maybe no longer)
    terminating = last.terminating
    if gone or came:
        terminating = (terminating - {j.job_id for j in gone}) | {j.job_id for j in came if j.terminating}
    return RunningPart(last.ix, tree, running, jobs, releases, by_unit, owner, terminating)
