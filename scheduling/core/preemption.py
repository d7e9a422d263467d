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
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from scheduling.core.index import NODE, FreeState, TopoIndex
from scheduling.core.placement import Fit, find_job
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


def effective_class(preemptor: PendingJob, victim: Candidate) -> int:
    """The victim's class as this preemptor sees it: a Tier 1 job's own team's in-quota Tier 2 work
    counts as borrowing (the Tier 1 job claims the team's guarantee before it)."""
    if victim.cls == RESEARCH and preemptor.tier == Tier.PRODUCTION and victim.job.team == preemptor.team:
        return RESEARCH_BORROWED
    return victim.cls


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

    # False runs the plain victim prefix for every gang (the reference of tests/property/test_fast_paths.py).
    count_in_one_leaf = True

    def __init__(
        self,
        ix: TopoIndex,
        running: tuple[RunningJob, ...],
        locs: Mapping[str, tuple[Loc, ...]],
        borrowed: Mapping[str, bool],
        config: Config,
        now: float,
        taken: set[str] | None = None,
    ) -> None:
        self.ix = ix
        self.locs = locs
        self.by_type = candidates(running, locs, borrowed, config, now)
        self.on_node: dict[int, list[tuple[Candidate, int]]] = {}
        self.cheapest_class: dict[int, int] = {}  # per node, its cheapest victim's class
        self.gpus_of_type: dict[str, int] = {}
        self.cover: dict[int, int] = {}  # per node, the GPUs its candidates hold on it
        named = [loc for cands in self.by_type.values() for c in cands for loc in c.locs]
        self.shared_gpus = len(named) != len(set(named))  # never in the portal (a database constraint)
        self.classes = {gpu_type: {c.cls for c in cands} for gpu_type, cands in self.by_type.items()}
        # (team, type) with in-quota Tier 2 candidates: where a Tier 1 preemptor of that team sees its own
        # team's work as borrowing (``effective_class``), so its victim order is its own.
        self.own_research = {(c.job.team, t) for t, cands in self.by_type.items() for c in cands if c.cls == RESEARCH}
        # Per type, where its Tier 2 candidates begin (the list is in class order).
        self.research_from = {
            t: next((i for i, c in enumerate(cands) if c.cls >= RESEARCH_BORROWED), len(cands))
            for t, cands in self.by_type.items()
        }
        for gpu_type, cands in self.by_type.items():
            self.gpus_of_type[gpu_type] = sum(len(c.locs) for c in cands)
            for c in cands:  # preference order is kept per node
                counts: dict[int, int] = {}
                for ni, _ in c.locs:
                    counts[ni] = counts.get(ni, 0) + 1
                for ni, k in counts.items():
                    self.on_node.setdefault(ni, []).append((c, k))
                    self.cover[ni] = self.cover.get(ni, 0) + k
                    if c.cls < self.cheapest_class.get(ni, RESEARCH + 1):
                        self.cheapest_class[ni] = c.cls
        # Victims (and awaited terminating jobs) already spoken for. A plan passes its own record (the same
        # set, not a copy): a victim taken by any of its paths, before this search was built or after,
        # is never offered again.
        self.taken: set[str] = taken if taken is not None else set()
        self.reserved: set[Loc] = set()
        self.reserved_nodes: set[int] = set()
        self.version = [0] * len(ix.nodes)
        self._heaps: dict[tuple[str, int, str], list[tuple[Cost, int, int]]] = {}
        self._may_take_cache: dict[tuple[str, int, str], list[Candidate]] = {}
        self._leaf_of: dict[str, list[int]] = {}
        self._position_cache: dict[int, dict[str, int]] = {}  # id of a ``_may_take_cache`` list -> places in it
        self._last_cache: dict[int, dict[int, tuple[int, int]]] = {}
        self._ends_cache: dict[int, list[int]] = {}
        self._freeable_cache: dict[tuple[int, int], dict[int, list[int]]] = {}
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

        ``one_leaf``: only a placement under one leaf switch counts (``placement.keep_in_leaf``). A job
        of ``one_fabric`` counts only a placement inside one fabric domain; the counted fast paths know
        leaves only, so it takes the plain prefix.
        """
        need = job.gpu_count
        if st.type_free.get(job.gpu_type, 0) + self.gpus_of_type.get(job.gpu_type, 0) < need:
            return None
        if need <= self.ix.type_max_node.get(job.gpu_type, 0) and not job.spread:
            found = self._one_node(st, job)
            if found is not None:
                return found
        largest = self.ix.type_max_node.get(job.gpu_type, 0)
        if one_leaf and self.count_in_one_leaf and need > largest and job.gpus_per_replica == largest and not job.one_fabric:
            return self._prefix_whole_nodes(st, job)  # whole nodes: distinct ones, spread or not
        usable = self.usable(job, own_first=False)
        return self._prefix(st, job, usable, one_leaf) if usable else None

    def usable(self, job: PendingJob, *, own_first: bool = True) -> list[Candidate]:
        """The victims ``job`` may take, not yet spoken for, in its preference order (``_may_take_all``)."""
        taken = self.taken
        return [c for c in self._may_take_all(job, own_first=own_first) if c.job.job_id not in taken]

    def _may_take_all(self, job: PendingJob, *, own_first: bool = True) -> list[Candidate]:
        # Which victims a preemptor may take, and in which order, depends only on its tier, its team and
        # the GPU type: built once per plan for each (what ``may_take`` reads), not per preemptor.
        # ``own_first=False``: a Tier 1 job's order without its own team's Tier 2 work moved ahead, the
        # order of every search for a gang larger than one node, so that all Tier 1 jobs share it: the
        # places, class runs and nodes' last victims that search reads are built once a plan, not once a
        # team (``_prefix_whole_nodes``). Only a gang on one node takes its own team's work first.
        own = own_first and self._sees_own(job)
        key = (job.gpu_type, job.tier, job.team if own or job.tier != Tier.PRODUCTION else "")
        found = self._may_take_cache.get(key)
        if found is None:
            # The list is in class order, and may_take only ever drops in-quota and borrowing Tier 2 work:
            # every preemptor shares the head (terminating and spot jobs), so only the tail is walked.
            cands = self.by_type.get(job.gpu_type, [])
            cut = self.research_from.get(job.gpu_type, len(cands))
            head, tail = cands[:cut], [c for c in cands[cut:] if may_take(job, c)]
            if own:
                # Its team's in-quota Tier 2 work joins the borrowing work, in the same order (two sorted
                # runs: the sort merges them).
                team = job.team
                mine = [
                    c._replace(cls=RESEARCH_BORROWED, key=(RESEARCH_BORROWED, *c.key[1:]))
                    for c in tail
                    if c.cls == RESEARCH and c.job.team == team
                ]
                borrowing = [c for c in tail if c.cls == RESEARCH_BORROWED]
                theirs = [c for c in tail if c.cls == RESEARCH and c.job.team != team]
                tail = [*sorted(borrowing + mine, key=itemgetter(0)), *theirs]
            found = self._may_take_cache[key] = head + tail
        return found

    def _positions(self, order: list[Candidate]) -> dict[str, int]:
        """Job id -> its place in ``order`` (a ``_may_take_all`` list: once per plan and preemptor kind)."""
        found = self._position_cache.get(id(order))
        if found is None:
            found = self._position_cache[id(order)] = {c.job.job_id: i for i, c in enumerate(order)}
        return found

    def _sees_own(self, job: PendingJob) -> bool:
        return job.tier == Tier.PRODUCTION and (job.team, job.gpu_type) in self.own_research

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

    def _nodes(self, gpu_type: str) -> list[int]:
        if gpu_type not in self._nodes_of_type:
            self._nodes_of_type[gpu_type] = [
                ni for ni, n in enumerate(self.ix.nodes) if n.schedulable and n.gpu_type == gpu_type and ni in self.on_node
            ]
        return self._nodes_of_type[gpu_type]

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

    def _ready_leaf(self, gpu_type: str) -> list[int]:
        """Node index -> its leaf, for the READY nodes of the type; -1 for every other node."""
        found = self._leaf_of.get(gpu_type)
        if found is None:
            found = self._leaf_of[gpu_type] = [n.leaf if n.gpu_type == gpu_type and n.schedulable else -1 for n in self.ix.nodes]
        return found

    def _prefix(self, st: FreeState, job: PendingJob, usable: list[Candidate], one_leaf: bool) -> Reclaim | None:
        """Free victims in preference order until the gang fits somewhere; keep those the fit uses."""
        if (
            one_leaf
            and self.count_in_one_leaf
            and not job.one_fabric
            and not job.spread
            and job.gpu_count > self.ix.type_max_node.get(job.gpu_type, 0)
        ):
            return self._prefix_in_one_leaf(st, job, usable)
        return self._prefix_plain(st, job, usable, one_leaf)

    def _prefix_whole_nodes(self, st: FreeState, job: PendingJob) -> Reclaim | None:
        """``_prefix_in_one_leaf`` for a gang of whole (largest) nodes, from when each node comes free.

        A replica takes a whole node, so a leaf fits once ``replicas`` of its nodes are entirely free,
        and a node is entirely free from its last victim in preference order on (when every GPU busy on
        it is a victim's). So each leaf's first fitting prefix is the victim at which its ``replicas``-th
        node comes free, read from the nodes' victims (``on_node``) and their places in the preemptor's
        order, and the prefix ends at the first check (where ``_prefix`` checks) at or after the earliest
        of them. Only the victims up to there are walked, for the checks' count of free GPUs; a Tier 1
        gang of 256 GPUs would otherwise count, GPU by GPU, thousands of small victims over the cluster.
        """
        if self.shared_gpus:  # a GPU named by two running jobs: counts by node would count it twice
            return self._prefix_in_one_leaf(st, job, self.usable(job, own_first=False))
        ix, t, per, replicas = self.ix, job.gpu_type, job.gpus_per_replica, job.replicas
        order = self._may_take_all(job, own_first=False)
        pos = self._positions(order)
        taken, reserved, reserved_nodes = self.taken, self.reserved, self.reserved_nodes
        gone = sorted(pos[j] for j in taken if j in pos)  # places in ``order`` that ``usable`` leaves out
        leaf_of, free_of, dfree = self._ready_leaf(t), st.free, st.dfree[NODE]

        def place(job_id: str) -> int:  # the victim's index in ``usable``
            at = pos[job_id]
            return at - bisect_left(gone, at)

        free_from: dict[int, list[int]] = {}  # leaf -> for each node that can come free, from which victim on
        already: dict[int, int] = {}  # leaf -> its nodes free now
        for li in range(len(st.leaf_tfree)):
            hist = st.leaf_hist[li].get(t)
            if hist is not None and per < len(hist) and hist[per]:
                already[li] = hist[per]
                free_from[li] = [-1] * hist[per]
        cover, version = self.cover, self.version
        lasts = self._last_cache.setdefault(id(order), {})  # node -> (its version, its last victim's place)
        for li, nodes in self._freeable(order, pos, st, per).items():
            if len(nodes) + already.get(li, 0) < replicas:
                continue  # even with all of them free, the leaf holds too few replicas
            for ni in nodes:
                busy = per - dfree[ni]
                # Most nodes hold GPUs no preemptor may take (Tier 1, young jobs, this plan's placements):
                # their victims' GPUs fall short of the busy ones, and the node is passed over unread.
                if busy == 0 or cover[ni] != busy or ni in reserved_nodes:
                    continue
                seen = lasts.get(ni)
                if seen is None or seen[0] != version[ni]:  # a claim on the node changed its victims
                    last = -1
                    for c, _ in self.on_node[ni]:
                        job_id = c.job.job_id
                        if job_id in taken or job_id not in pos:
                            last = -2  # a busy GPU this job may not have: the node never comes free for it
                            break
                        last = max(last, pos[job_id])
                    seen = lasts[ni] = (version[ni], last)
                if seen[1] >= 0:
                    free_from.setdefault(li, []).append(seen[1] - bisect_left(gone, seen[1]))
        fits_from = {li: sorted(at)[replicas - 1] for li, at in free_from.items() if len(at) >= replicas}
        if not fits_from:
            return None
        first = min(fits_from.values())
        for i in self._checks(st, job, order, gone):
            if i < first:
                continue
            # The GPUs the plain prefix would have given back in the leaves that fit: the search picks
            # among those leaves as it would (the others fit in neither).
            given = sorted(
                loc
                for li, at in fits_from.items()
                if at <= i
                for ni in ix.leaf_nodes[li]
                if leaf_of[ni] >= 0
                for c, _ in self.on_node.get(ni, ())
                if c.job.job_id not in taken and c.job.job_id in pos and place(c.job.job_id) <= i
                for loc in c.locs
                if loc[0] == ni and not free_of[ni][loc[1]] and not (ni in reserved_nodes and loc in reserved)
            )
            st.give_locs(given)
            fit = find_job(st, job, one_leaf=True)
            st.take_locs(given)
            if fit is None:  # the counts and the search disagree: let the plain prefix decide
                return self._prefix_plain(st, job, self.usable(job, own_first=False), True)
            # The victims of the prefix whose GPUs the fit uses, in preference order: all on its nodes.
            used = {(ni, p) for ni, positions in fit.replicas for p in positions}
            on_fit = {
                c.job.job_id: c.job
                for ni, _ in fit.replicas
                for c, _ in self.on_node.get(ni, ())
                if c.job.job_id not in taken and c.job.job_id in pos and place(c.job.job_id) <= i and not used.isdisjoint(c.locs)
            }
            waits_on = tuple(sorted(on_fit.values(), key=lambda j: pos[j.job_id]))
            return Reclaim(fit, tuple(j for j in waits_on if not j.terminating), waits_on)
        return None

    def _freeable(self, order: list[Candidate], pos: Mapping[str, int], st: FreeState, per: int) -> dict[int, list[int]]:
        """Leaf -> its READY nodes of ``per`` GPUs that ``order``'s victims could free entirely, as of the
        first search of the plan that asks. Later in the plan a node only gets further from free (its GPUs
        placed, its victims taken, reserved), so this stays a superset, and leaves with too few are
        passed over at once."""
        key = (id(order), per)
        found = self._freeable_cache.get(key)
        if found is None:
            found = {}
            leaf_of, dfree = self._ready_leaf(order[0].job.gpu_type) if order else [], st.dfree[NODE]
            for ni in self._nodes(order[0].job.gpu_type) if order else ():
                busy = per - dfree[ni]
                whole = busy and self.cover[ni] == busy and len(self.ix.nodes[ni].gpu_ids) == per
                if whole and all(c.job.job_id in pos for c, _ in self.on_node[ni]):
                    found.setdefault(leaf_of[ni], []).append(ni)
            self._freeable_cache[key] = found
        return found

    def _checks(self, st: FreeState, job: PendingJob, order: list[Candidate], gone: list[int]) -> Iterator[int]:
        """The indexes in ``usable`` (``order`` less the places in ``gone``) at which ``_prefix`` checks.

        After each victim it checks if the type has GPUs enough and it is the last of its class or
        ``step`` victims have gone by since the last check (1, doubling after 16 checks, up to 64). Once
        the type has GPUs enough (a busy cluster has more free GPUs than most gangs from the start) the
        places follow from the class boundaries alone: only the victims before that are walked.
        """
        t, need, taken, reserved, reserved_nodes = job.gpu_type, job.gpu_count, self.taken, self.reserved, self.reserved_nodes
        count = len(order) - len(gone)
        ends = sorted({b - bisect_left(gone, b) - 1 for b in self._class_ends(order)} - {-1})
        checks, step, since, at = 0, 1, 0, -1
        type_free = st.type_free.get(t, 0)
        if type_free < need:
            leaf_of, free_of, last_of_class = self._ready_leaf(t), st.free, set(ends)
            for at, cand in enumerate(c for c in order if c.job.job_id not in taken):
                for loc in cand.locs:
                    if (
                        leaf_of[loc[0]] >= 0
                        and not free_of[loc[0]][loc[1]]
                        and not (loc[0] in reserved_nodes and loc in reserved)
                    ):
                        type_free += 1
                since += 1
                if type_free < need:
                    continue
                if since >= step or at in last_of_class:
                    since, checks = 0, checks + 1
                    yield at
                break
            else:
                return
        while at < count - 1:
            later = ends[bisect_left(ends, at + 1)]
            at, since = min(at + step - since, later), 0
            if checks >= 16:
                step = min(step * 2, 64)
            checks += 1
            yield at

    def _class_ends(self, order: list[Candidate]) -> list[int]:
        """Places in ``order`` just past the end of each class's run (the list is in class order)."""
        found = self._ends_cache.get(id(order))
        if found is None:
            found = self._ends_cache[id(order)] = [
                i + 1 for i in range(len(order)) if i + 1 == len(order) or order[i + 1].cls != order[i].cls
            ]
        return found

    def _prefix_plain(self, st: FreeState, job: PendingJob, usable: list[Candidate], one_leaf: bool) -> Reclaim | None:
        """``_prefix`` on the live state: each victim's GPUs given back in turn, all taken back at the end."""
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
            fit = find_job(st, job, one_leaf=one_leaf)
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

    def _prefix_in_one_leaf(self, st: FreeState, job: PendingJob, usable: list[Candidate]) -> Reclaim | None:
        """``_prefix`` for a gang larger than a node that must stay under one leaf, in counts.

        Such a gang fits exactly when some leaf has, on its READY nodes of the type, as many free GPUs
        as the gang and room for its replicas (``placement._multi_node``), and freeing victims only
        raises those counts. So victims are freed in counts (free GPUs per touched node and leaf, replica
        room per leaf), checked where ``_prefix`` checks, and only at the first check where a leaf fits
        are their GPUs in fitting leaves given back for the real search: it sees those leaves exactly as
        ``_prefix`` would (the others fit in neither) and picks the same placement. A large gang could
        otherwise free thousands of small victims one by one over the whole cluster, then take them back.
        """
        ix, t, per, replicas, need = self.ix, job.gpu_type, job.gpus_per_replica, job.replicas, job.gpu_count
        nodes, dfree, reserved = ix.nodes, st.dfree[NODE], self.reserved
        type_free = st.type_free.get(t, 0)
        fitting = {
            li for li, free in enumerate(st.leaf_tfree) if free.get(t, 0) >= need and st.leaf_capacity(li, t, per) >= replicas
        }
        node_free: dict[int, int] = {}
        leaf_free: dict[int, int] = {}
        leaf_room: dict[int, int] = {}
        freed: set[Loc] = set()  # a GPU named by two running jobs is freed once
        checks = 0
        step = 1
        since_check = 0
        leaf_of = self._ready_leaf(t)
        free_of = st.free
        for i, cand in enumerate(usable):
            for loc in cand.locs:
                ni, p = loc
                li = leaf_of[ni]
                # What giving it back would change for this job: a busy, unreserved GPU of its type on a
                # READY node (other GPUs change nothing its search reads).
                if li < 0 or free_of[ni][p] or loc in reserved or loc in freed:
                    continue
                freed.add(loc)
                type_free += 1
                old = node_free.get(ni, dfree[ni])
                node_free[ni] = old + 1
                if li not in leaf_free:
                    leaf_free[li], leaf_room[li] = st.leaf_tfree[li].get(t, 0), st.leaf_capacity(li, t, per)
                leaf_free[li] += 1
                leaf_room[li] += (old + 1) // per - old // per
                if leaf_free[li] >= need and leaf_room[li] >= replicas:
                    fitting.add(li)
            since_check += 1
            last_of_class = i + 1 == len(usable) or usable[i + 1].cls != cand.cls
            if type_free < need or (since_check < step and not last_of_class):
                continue
            since_check = 0
            checks += 1
            if checks > 16:
                step = min(step * 2, 64)
            if not fitting:
                continue
            given = sorted(loc for loc in freed if nodes[loc[0]].leaf in fitting)
            st.give_locs(given)
            fit = find_job(st, job, one_leaf=True)
            st.take_locs(given)
            if fit is None:  # the counts and the search disagree: let the plain prefix decide
                return self._prefix_plain(st, job, usable, True)
            used = {(ni, p) for ni, positions in fit.replicas for p in positions}
            waits_on = tuple(c.job for c in usable[: i + 1] if any(loc in used for loc in c.locs))
            return Reclaim(fit, tuple(j for j in waits_on if not j.terminating), waits_on)
        return None
