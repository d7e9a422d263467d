"""Preemption's victims: who a preemptor may take, in which order, and a victim search's state.

Every running job some preemptor could take is a ``Candidate`` of a class (cheapest first: terminating,
borrowed spot, spot, borrowed Tier 2, in-quota Tier 2); ``VictimSearch`` holds what one plan's search
builds once (per type, per node, per preemptor kind) and what is already spoken for. The searches
themselves are in ``victim_prefix`` (a victim prefix in preference order) and ``preemption`` (one node,
and the ``Reclaimer`` that picks between them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import NamedTuple

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE, TopoIndex
from scheduling.core.placement_fit import Fit
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


class VictimSearch:
    """The state of one plan's victim search: candidates per type and per node, the orders each kind
    of preemptor takes them in, and the victims and GPUs already spoken for."""

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

    def _nodes(self, gpu_type: str) -> list[int]:
        if gpu_type not in self._nodes_of_type:
            self._nodes_of_type[gpu_type] = [
                ni for ni, n in enumerate(self.ix.nodes) if n.schedulable and n.gpu_type == gpu_type and ni in self.on_node
            ]
        return self._nodes_of_type[gpu_type]

    def _ready_leaf(self, gpu_type: str) -> list[int]:
        """Node index -> its leaf, for the READY nodes of the type; -1 for every other node."""
        found = self._leaf_of.get(gpu_type)
        if found is None:
            found = self._leaf_of[gpu_type] = [n.leaf if n.gpu_type == gpu_type and n.schedulable else -1 for n in self.ix.nodes]
        return found

    def _class_ends(self, order: list[Candidate]) -> list[int]:
        """Places in ``order`` just past the end of each class's run (the list is in class order)."""
        found = self._ends_cache.get(id(order))
        if found is None:
            found = self._ends_cache[id(order)] = [
                i + 1 for i in range(len(order)) if i + 1 == len(order) or order[i + 1].cls != order[i].cls
            ]
        return found

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
