"""Reclaim and preemption: the least set of victims that frees a topology-valid placement.

Victims are freed in order of preference (already terminating jobs first, at no cost;
then Tier 3 before Tier 2, borrowed before in-quota, least work lost since the last
checkpoint, newest first) until the gang fits; only the victims whose GPUs that
placement actually uses are preempted, so the victims are the cheapest ones that make
room *together*, in one domain, not GPUs scattered over the cluster.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from scheduling.core.index import NODE, FreeState, TopoIndex
from scheduling.core.placement import Fit, find
from scheduling.core.types import Config, PendingJob, RunningJob, Tier

Loc = tuple[int, int]

# Victim classes, cheapest first.
TERMINATING, SPOT_BORROWED, SPOT, RESEARCH_BORROWED, RESEARCH = range(5)


class Candidate(NamedTuple):
    # A NamedTuple, not a frozen dataclass: one is built per running job per plan, and
    # frozen dataclasses are several times slower to construct.
    key: tuple[int, float, float, str]  # preference order: class, work lost, newest first, id
    job: RunningJob
    cls: int
    work_lost: float  # GPU-seconds since the last checkpoint (or the start)
    locs: tuple[Loc, ...]


def candidates(
    running: tuple[RunningJob, ...],
    locs: Mapping[str, tuple[Loc, ...]],
    borrowed: Mapping[str, bool],
    config: Config,
    now: float,
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
        work_lost = max(now - since, 0.0) * sum(map(len, job.replicas))
        key = (cls, work_lost, -job.start, job.job_id)
        out.setdefault(job.gpu_type, []).append(Candidate(key, job, cls, work_lost, locs[job.job_id]))
    for cands in out.values():
        cands.sort(key=itemgetter(0))
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


Cost = tuple[int, int, float, int]  # worst victim class, victims, work lost, node index


class Reclaimer:
    """Victim search for one plan. Per node, the cheapest victims for a given need are cached
    and recomputed only when that node changes, so many preemptors per plan stay cheap."""

    def __init__(
        self,
        ix: TopoIndex,
        running: tuple[RunningJob, ...],
        locs: Mapping[str, tuple[Loc, ...]],
        borrowed: Mapping[str, bool],
        config: Config,
        now: float,
    ) -> None:
        self.ix = ix
        self.locs = locs
        self.by_type = candidates(running, locs, borrowed, config, now)
        self.on_node: dict[int, list[tuple[Candidate, int]]] = {}
        self.gpus_of_type: dict[str, int] = {}
        self.classes = {gpu_type: {c.cls for c in cands} for gpu_type, cands in self.by_type.items()}
        for gpu_type, cands in self.by_type.items():
            self.gpus_of_type[gpu_type] = sum(len(c.locs) for c in cands)
            for c in cands:  # preference order is kept per node
                counts: dict[int, int] = {}
                for ni, _ in c.locs:
                    counts[ni] = counts.get(ni, 0) + 1
                for ni, k in counts.items():
                    self.on_node.setdefault(ni, []).append((c, k))
        self.taken: set[str] = set()  # victims (and awaited terminating jobs) already spoken for
        self.reserved: set[Loc] = set()
        self.reserved_nodes: set[int] = set()
        self.version = [0] * len(ix.nodes)
        self._heaps: dict[tuple[str, int, str], list[tuple[Cost, int, int]]] = {}
        self._nodes_of_type: dict[str, list[int]] = {}

    def claim(self, jobs: tuple[RunningJob, ...], locs: set[Loc]) -> None:
        """Victims and GPUs now promised to a preemptor or a reservation: not offered again."""
        self.taken.update(j.job_id for j in jobs)
        self.reserved |= locs
        nodes = {ni for ni, _ in locs}
        self.reserved_nodes |= nodes
        for j in jobs:
            nodes.update(ni for ni, _ in self.locs.get(j.job_id, ()))
        for ni in nodes:
            self.version[ni] += 1

    def find(self, st: FreeState, job: PendingJob, *, one_leaf: bool = False) -> Reclaim | None:
        """The cheapest topology-valid placement for ``job`` after preempting some running jobs.

        ``one_leaf``: only a placement under one leaf switch counts (``placement.keep_in_leaf``).
        """
        need = job.gpu_count
        if st.type_free.get(job.gpu_type, 0) + self.gpus_of_type.get(job.gpu_type, 0) < need:
            return None
        if need <= self.ix.type_max_node.get(job.gpu_type, 0):
            found = self._one_node(st, job)
            if found is not None:
                return found
        usable = [c for c in self.by_type.get(job.gpu_type, []) if c.job.job_id not in self.taken and may_take(job, c)]
        return self._prefix(st, job, usable, one_leaf) if usable else None

    def _trial(self, st: FreeState, job: PendingJob, chosen: list[Candidate]) -> Reclaim | None:
        """Search with the victims' GPUs freed, on the live state, then put them back."""
        given = sorted({loc for c in chosen for loc in c.locs if loc not in self.reserved and not st.free[loc[0]][loc[1]]})
        st.give_locs(given)
        fit = find(st, job.gpu_type, job.replicas, job.gpus_per_replica)
        st.take_locs(given)
        if fit is None:
            return None
        used = {(ni, p) for ni, positions in fit.replicas for p in positions}
        waits_on = tuple(c.job for c in chosen if any(loc in used for loc in c.locs))
        victims = tuple(j for j in waits_on if not j.terminating)
        return Reclaim(fit, victims, waits_on)

    def _one_node(self, st: FreeState, job: PendingJob) -> Reclaim | None:
        """A gang that fits in one node: the node where the cheapest victims make room.

        Cost of a node: (worst victim class, number of victims, work lost), so one spot job on
        one node beats two on another, and any number of spot jobs beats one Tier 2 job. Spot
        victims, which every preemptor may take, are searched first; only when no node can be
        freed with them are the preemptor's other possible victims considered.
        """
        classes = self.classes.get(job.gpu_type, set())
        chosen = None
        if classes & {TERMINATING, SPOT_BORROWED, SPOT}:
            chosen = self._best_node(st, job, "spot")
        if chosen is None and classes & {RESEARCH_BORROWED, RESEARCH}:
            chosen = self._best_node(st, job, "tier-1" if job.tier == Tier.PRODUCTION else f"team:{job.team}")
        return self._trial(st, job, chosen) if chosen is not None else None

    def _best_node(self, st: FreeState, job: PendingJob, kind: str) -> list[Candidate] | None:
        # A lazy heap of nodes by cost, per (type, need, kind). Costs only grow during a plan
        # (free GPUs shrink, victims and GPUs get claimed), so a stale entry is a lower bound:
        # recompute it when it reaches the top, and a fresh top is the cheapest node.
        need = job.gpu_count
        dfree = st.dfree[NODE]
        key = (job.gpu_type, need, kind)
        heap = self._heaps.get(key)
        if heap is None:
            heap = []
            for ni in self._nodes(job.gpu_type):
                if len(self.ix.nodes[ni].gpu_ids) >= need:
                    cost, _ = self._node_cost(ni, dfree[ni], need, job, kind)
                    if cost is not None:
                        heap.append((cost, self.version[ni], dfree[ni]))
            heapq.heapify(heap)
            self._heaps[key] = heap
        while heap:
            cost, version, free = heap[0]
            ni = cost[3]
            fresh_cost, chosen = self._node_cost(ni, dfree[ni], need, job, kind)
            if version == self.version[ni] and free == dfree[ni]:
                return chosen
            heapq.heappop(heap)
            if fresh_cost is not None:
                heapq.heappush(heap, (fresh_cost, self.version[ni], dfree[ni]))
        return None

    def _nodes(self, gpu_type: str) -> list[int]:
        if gpu_type not in self._nodes_of_type:
            self._nodes_of_type[gpu_type] = [
                ni for ni, n in enumerate(self.ix.nodes) if n.schedulable and n.gpu_type == gpu_type and ni in self.on_node
            ]
        return self._nodes_of_type[gpu_type]

    def _node_cost(self, ni: int, free: int, need: int, job: PendingJob, kind: str) -> tuple[Cost | None, list[Candidate]]:
        chosen: list[Candidate] = []
        worst, count, lost = TERMINATING, 0, 0.0
        for c, k in self.on_node[ni]:
            if free >= need:
                break
            if c.job.job_id in self.taken or (c.cls > SPOT if kind == "spot" else not may_take(job, c)):
                continue
            if ni in self.reserved_nodes:
                k = sum(1 for loc in c.locs if loc[0] == ni and loc not in self.reserved)
            free += k
            chosen.append(c)
            if c.cls != TERMINATING:
                worst, count, lost = max(worst, c.cls), count + 1, lost + c.work_lost
        if free < need:
            return None, []
        return (worst, count, lost, ni), chosen

    def _prefix(self, st: FreeState, job: PendingJob, usable: list[Candidate], one_leaf: bool) -> Reclaim | None:
        """Free victims in preference order until the gang fits somewhere; keep those the fit uses."""
        need = job.gpu_count
        freed: list[Loc] = []
        found: Reclaim | None = None
        checks = 0
        step = 1
        since_check = 0
        for i, cand in enumerate(usable):
            mine = [(ni, p) for ni, p in cand.locs if (ni, p) not in self.reserved and not st.free[ni][p]]
            st.give_locs(mine)
            freed.extend(mine)
            since_check += 1
            last_of_class = i + 1 == len(usable) or usable[i + 1].cls != cand.cls
            if st.type_free.get(job.gpu_type, 0) < need or (since_check < step and not last_of_class):
                continue
            fit = find(st, job.gpu_type, job.replicas, job.gpus_per_replica, one_leaf=one_leaf)
            since_check = 0
            checks += 1
            # Check after every victim at first, then less often: the search stays cheap when
            # thousands of small jobs would have to go, at the price of a slightly longer prefix.
            if checks > 16:
                step = min(step * 2, 64)
            if fit is not None:
                used = {(ni, p) for ni, positions in fit.replicas for p in positions}
                waits_on = tuple(c.job for c in usable[: i + 1] if any(loc in used for loc in c.locs))
                found = Reclaim(fit, tuple(j for j in waits_on if not j.terminating), waits_on)
                break
        st.take_locs(freed)
        return found
