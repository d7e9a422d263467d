"""Reclaim and preemption: the least set of victims that frees a topology-valid placement.

Victims are freed in order of preference (already terminating jobs first, at no cost;
then Tier 3 before Tier 2, borrowed before in-quota, least work lost since the last
checkpoint, newest first) until the gang fits; only the victims whose GPUs that
placement actually uses are preempted, so the victims are the cheapest ones that make
room *together*, in one domain, not GPUs scattered over the cluster.

A Tier 1 job whose gang fits one node takes its own team's in-quota Tier 2 work before other
teams' (``effective_class``): the team's guarantee is claimed in tier order (``quota``), so that work
is what borrows once the Tier 1 job runs, and taking another team's instead would only make that team
reclaim it next. A larger gang frees victims in the common order, which every Tier 1 job of a plan
shares (its search reads structures built once a plan: ``_prefix_whole_nodes``).
A job that would pass a limit of its team or an ancestor also needs victims under that unit
(``Reclaimer.under_limits``), since a limit caps what a unit holds whoever holds it.

Who may be taken, in which order, and a search's state are in ``victims``; the prefix searches are in
``victim_prefix``; this module picks between them (``Reclaimer``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE
from scheduling.core.placement import find_job
from scheduling.core.types import PendingJob, RunningJob, Tier
from scheduling.core.victim_prefix import PrefixSearch
from scheduling.core.victims import (
    RESEARCH,
    RESEARCH_BORROWED,
    SPOT,
    SPOT_BORROWED,
    TERMINATING,
    Candidate,
    Cost,
    Reclaim,
    effective_class,
    may_take,
)

__all__ = ["Reclaim", "Reclaimer"]


class Reclaimer(PrefixSearch):
    """Victim search for one plan. Per node, the cheapest victims for a given need are cached
    and recomputed only when that node changes, so many preemptors per plan stay cheap."""

    def find(self, st: FreeState, job: PendingJob, *, one_leaf: bool = False) -> Reclaim | None:
        """The cheapest topology-valid placement for ``job`` after preempting some running jobs.

        ``one_leaf``: only a placement under one leaf switch counts (``placement.keep_in_leaf``). A job
        of ``one_fabric`` counts only a placement inside one fabric domain; the counted fast paths know
        leaves only, so it takes the plain prefix, as does a job that ``needs`` node capabilities (the
        counts know every node of its type).
        """
        need = job.gpu_count
        if st.type_free.get(job.gpu_type, 0) + self.gpus_of_type.get(job.gpu_type, 0) < need:
            return None
        if need <= self.ix.type_max_node.get(job.gpu_type, 0) and not job.spread and not job.needs:
            found = self._one_node(st, job)
            if found is not None:
                return found
        largest = self.ix.type_max_node.get(job.gpu_type, 0)
        if (
            one_leaf
            and self.count_in_one_leaf
            and need > largest
            and job.gpus_per_replica == largest
            and not job.one_fabric
            and not job.needs
        ):
            return self._prefix_whole_nodes(st, job)  # whole nodes: distinct ones, spread or not
        usable = self.usable(job, own_first=False)
        return self._prefix(st, job, usable, one_leaf) if usable else None

    def under_limits(
        self, job: PendingJob, excess: Mapping[str, int], chain: Callable[[str], tuple[str, ...]], freeing: tuple[RunningJob, ...]
    ) -> list[RunningJob] | None:
        """More victims, so that every unit of ``excess`` (unit -> GPUs beyond its limit with ``job``
        placed) comes back under its limit once ``freeing`` (the jobs whose GPUs the placement waits
        for) and they are gone; in ``job``'s preference order (terminating jobs first: they are going
        anyway). None when even every possible victim would not be enough."""
        left = dict(excess)
        for j in freeing:
            for unit in chain(j.team):
                if unit in left:
                    left[unit] -= j.gpu_count
        more: list[RunningJob] = []
        spoken = {j.job_id for j in freeing}
        for c in self.usable(job):
            if all(n <= 0 for n in left.values()):
                break
            if c.job.job_id in spoken:
                continue
            if not any(left.get(u, 0) > 0 for u in chain(c.job.team)):
                continue  # not under a unit that is still over: freeing it changes no limit
            more.append(c.job)
            for u in chain(c.job.team):
                if u in left:
                    left[u] -= c.job.gpu_count
        return more if all(n <= 0 for n in left.values()) else None

    def _trial(self, st: FreeState, job: PendingJob, chosen: list[Candidate]) -> Reclaim | None:
        """Search with the victims' GPUs freed, on the live state, then put them back."""
        given = sorted({loc for c in chosen for loc in c.locs if loc not in self.reserved and not st.free[loc[0]][loc[1]]})
        st.give_locs(given)
        fit = find_job(st, job)
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
            if job.tier != Tier.PRODUCTION:
                kind = f"team:{job.team}"
            else:
                kind = f"tier-1:{job.team}" if self._sees_own(job) else "tier-1"
            chosen = self._best_node(st, job, kind)
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
            # Spot victims only, or (a Tier 2 preemptor) spot and borrowing ones: a node whose cheapest
            # victim class is dearer has no cost unless it has room already, so its jobs are not walked
            # (most nodes hold only in-quota work).
            dearest = SPOT if kind == "spot" else RESEARCH_BORROWED if kind.startswith("team:") else RESEARCH
            for ni in self._nodes(job.gpu_type):
                if self.cheapest_class[ni] > dearest and dfree[ni] < need:
                    continue
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

    def _node_cost(self, ni: int, free: int, need: int, job: PendingJob, kind: str) -> tuple[Cost | None, list[Candidate]]:
        chosen: list[Candidate] = []
        worst, count, lost = TERMINATING, 0, 0.0
        on_node: Iterable[tuple[Candidate, int]] = self.on_node[ni]
        own = kind.startswith("tier-1:")
        if own:
            # This Tier 1 job's own team's in-quota Tier 2 work before other teams' (``effective_class``):
            # the node's list is in class order, so only its in-quota Tier 2 tail is reordered.
            cut = next((i for i, (c, _) in enumerate(self.on_node[ni]) if c.cls == RESEARCH), None)
            if cut is not None:
                head, tail = self.on_node[ni][:cut], self.on_node[ni][cut:]
                team = job.team
                on_node = [*head, *(ck for ck in tail if ck[0].job.team == team), *(ck for ck in tail if ck[0].job.team != team)]
        for c, k in on_node:
            if free >= need:
                break
            if c.job.job_id in self.taken or (c.cls > SPOT if kind == "spot" else not may_take(job, c)):
                continue
            if ni in self.reserved_nodes:
                k = sum(1 for loc in c.locs if loc[0] == ni and loc not in self.reserved)
            free += k
            chosen.append(c)
            if c.cls != TERMINATING:
                cls = effective_class(job, c) if own else c.cls
                worst, count, lost = max(worst, cls), count + 1, lost + c.work_lost
        if free < need:
            return None, []
        return (worst, count, lost, ni), chosen
