"""Reclaim and preemption: the least set of victims that frees a topology-valid placement.

Victims are freed in order of preference (already terminating jobs first, at no cost;
then Tier 3 before Tier 2, borrowed before in-quota, least work lost since the last
checkpoint, newest first) until the gang fits; only the victims whose GPUs that
placement actually uses are preempted, so the victims are the cheapest ones that make
room *together*, in one domain, not GPUs scattered over the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scheduling.core.index import NODE, FreeState, TopoIndex
from scheduling.core.placement import Fit, find
from scheduling.core.types import Config, PendingJob, RunningJob, Tier

Loc = tuple[int, int]

# Victim classes, cheapest first.
TERMINATING, SPOT_BORROWED, SPOT, RESEARCH_BORROWED, RESEARCH = range(5)


@dataclass(frozen=True, slots=True)
class Candidate:
    job: RunningJob
    cls: int
    work_lost: float  # GPU-seconds since the last checkpoint (or the start)
    locs: tuple[Loc, ...]

    @property
    def key(self) -> tuple[int, float, float, str]:
        return (self.cls, self.work_lost, -self.job.start, self.job.job_id)


def candidates(
    ix: TopoIndex, running: tuple[RunningJob, ...], borrowed: Mapping[str, bool], config: Config, now: float
) -> dict[str, list[Candidate]]:
    """Per GPU type, every running job that some preemptor could take, in preference order."""
    out: dict[str, list[Candidate]] = {}
    for job in running:
        if job.terminating:
            cls = TERMINATING
        elif job.tier == Tier.PRODUCTION or now - job.start < config.min_runtime_s:
            continue
        elif job.tier == Tier.SPOT:
            cls = SPOT_BORROWED if borrowed.get(job.job_id) else SPOT
        else:
            cls = RESEARCH_BORROWED if borrowed.get(job.job_id) else RESEARCH
        since = max(job.start, job.last_checkpoint if job.last_checkpoint is not None else job.start)
        work_lost = max(now - since, 0.0) * job.gpu_count
        locs = tuple(ix.gpu_loc[g] for r in job.replicas for g in r if g in ix.gpu_loc)
        out.setdefault(job.gpu_type, []).append(Candidate(job, cls, work_lost, locs))
    for cands in out.values():
        cands.sort(key=lambda c: c.key)
    return out


def may_take(preemptor: PendingJob, victim: Candidate) -> bool:
    """Tier 1 may take any Tier 2/3 job; a Tier 2 job within its guarantee takes Tier 3 and borrowers."""
    if victim.cls in (TERMINATING, SPOT_BORROWED, SPOT):
        return True
    if victim.cls == RESEARCH_BORROWED:
        return preemptor.tier == Tier.PRODUCTION or victim.job.team != preemptor.team
    return preemptor.tier == Tier.PRODUCTION


@dataclass(frozen=True, slots=True)
class Reclaim:
    fit: Fit
    victims: tuple[RunningJob, ...]  # to preempt now (terminating jobs excluded: they are already going)
    waits_on: tuple[RunningJob, ...]  # every job whose GPUs the fit uses, terminating ones included


def find_reclaim(
    st: FreeState,
    job: PendingJob,
    cands: list[Candidate],
    taken: set[str],
    reserved: set[Loc],
) -> Reclaim | None:
    """The cheapest topology-valid placement for ``job`` after preempting some of ``cands``."""
    usable = [c for c in cands if c.job.job_id not in taken and may_take(job, c)]
    need = job.gpu_count
    freeable = sum(1 for c in usable for loc in c.locs if loc not in reserved)
    if not usable or st.type_free.get(job.gpu_type, 0) + freeable < need:
        return None
    if need <= st.ix.type_max_node.get(job.gpu_type, 0):
        found = _one_node(st, job, usable, reserved)
        if found is not None:
            return found
    return _prefix(st, job, usable, reserved)


def _outcome(hypo: FreeState, job: PendingJob, usable: list[Candidate]) -> Reclaim | None:
    fit = find(hypo, job.gpu_type, job.replicas, job.gpus_per_replica)
    if fit is None:
        return None
    used = {(ni, p) for ni, positions in fit.replicas for p in positions}
    waits_on = tuple(c.job for c in usable if any(loc in used for loc in c.locs))
    victims = tuple(j for j in waits_on if not j.terminating)
    return Reclaim(fit, victims, waits_on)


def _one_node(st: FreeState, job: PendingJob, usable: list[Candidate], reserved: set[Loc]) -> Reclaim | None:
    """A gang that fits in one node: the node where the cheapest victims make room.

    Cost of a node: (worst victim class, number of victims, work lost), so one spot job on
    one node beats two on another, and any number of spot jobs beats one Tier 2 job.
    """
    ix = st.ix
    need = job.gpu_count
    on_node: dict[int, list[tuple[Candidate, int]]] = {}
    for c in usable:
        counts: dict[int, int] = {}
        for loc in c.locs:
            if loc not in reserved:
                counts[loc[0]] = counts.get(loc[0], 0) + 1
        for ni, k in counts.items():
            on_node.setdefault(ni, []).append((c, k))
    best: tuple[tuple[int, int, float, int], list[Candidate]] | None = None
    for ni, victims in on_node.items():
        node = ix.nodes[ni]
        if not node.schedulable or node.gpu_type != job.gpu_type or len(node.gpu_ids) < need:
            continue
        free = st.dfree[NODE][ni]
        chosen: list[Candidate] = []
        worst, count, lost = TERMINATING, 0, 0.0
        for c, k in victims:  # already in preference order
            if free >= need:
                break
            free += k
            chosen.append(c)
            if c.cls != TERMINATING:
                worst, count, lost = max(worst, c.cls), count + 1, lost + c.work_lost
        if free < need:
            continue
        cost = (worst, count, lost, ni)
        if best is None or cost < best[0]:
            best = (cost, chosen)
    if best is None:
        return None
    hypo = st.clone()
    for c in best[1]:
        for ni, p in c.locs:
            if (ni, p) not in reserved:
                hypo.give(ni, (p,))
    return _outcome(hypo, job, best[1])


def _prefix(st: FreeState, job: PendingJob, usable: list[Candidate], reserved: set[Loc]) -> Reclaim | None:
    """Free victims in preference order until the gang fits somewhere; keep those the fit uses."""
    need = job.gpu_count
    hypo = st.clone()
    checks = 0
    step = 1
    since_check = 0
    for i, cand in enumerate(usable):
        mine = [loc for loc in cand.locs if loc not in reserved]
        for ni, p in mine:
            hypo.give(ni, (p,))
        since_check += 1
        last_of_class = i + 1 == len(usable) or usable[i + 1].cls != cand.cls
        if hypo.type_free.get(job.gpu_type, 0) < need or (since_check < step and not last_of_class):
            continue
        found = _outcome(hypo, job, usable[: i + 1])
        since_check = 0
        checks += 1
        # Check after every victim at first, then less often: the search stays cheap when
        # thousands of small jobs would have to go, at the price of a slightly longer prefix.
        if checks > 16:
            step = min(step * 2, 64)
        if found is not None:
            return found
    return None
