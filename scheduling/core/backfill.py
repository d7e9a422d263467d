"""Reservations for EASY backfill: when and where the first blocked job will fit.

Running jobs end at the latest at start + time_limit (a terminating job within the
grace period); replaying those ends in time order over a copy of the free state finds
the earliest moment the gang fits, and the topology domain where it does. Feasibility
only grows as jobs end, so the moment is found by galloping then bisecting over the
end times instead of searching after every single end. For a gang larger than a node
it is found in counts instead (``_earliest_in_counts``).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from itertools import compress, islice
from operator import itemgetter, ne
from typing import NamedTuple

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE, TopoIndex
from scheduling.core.placement import find_job
from scheduling.core.placement_fit import Fit
from scheduling.core.types import PendingJob

Loc = tuple[int, int]


class Release(NamedTuple):
    end: float
    job_id: str
    locs: tuple[Loc, ...]


_END = itemgetter(0)  # a Release's end

# False: every gang takes the galloping search (the reference of tests/property/test_fast_paths.py).
COUNT_MULTI_NODE = True
COUNT_ONE_NODE = True


def _apply(st: FreeState, releases: list[Release], start: int, stop: int, reserved: set[Loc]) -> None:
    # Every end in [start, stop) happens before the next search, so their GPUs are given back in one
    # batch, node by node: the same free state as job by job (giving is idempotent per GPU), with one
    # update per node instead of one per job and node; replaying ends was a fifth of a placeable plan.
    st.give_locs([loc for rel in releases[start:stop] for loc in rel.locs if loc not in reserved])


def earliest_fit(
    st: FreeState,
    releases: list[Release],
    reserved: set[Loc],
    job: PendingJob,
    *,
    one_leaf: bool = False,
    until: float = math.inf,
    when_only: bool = False,
) -> tuple[float, Fit] | None:
    """The earliest release time after which ``job``'s gang fits (its GPUs, cores, memory and fabric
    rule: ``placement.find_job``), with the placement then; None if never (or, with ``until``, not
    before it: later ends are not replayed).

    ``releases`` must be sorted by end time. GPUs in ``reserved`` stay held for others.
    ``one_leaf``: only a placement under one leaf switch counts (``placement.keep_in_leaf``).
    ``when_only``: the caller reads the time alone (the estimated starts); the placement returned is one
    that fits then, not necessarily the one the whole state at that time would choose.
    """
    gpu_type, replicas, per_replica = job.gpu_type, job.replicas, job.gpus_per_replica
    need = replicas * per_replica
    if until != math.inf:
        releases = releases[: bisect_left(releases, until, key=_END)]
    if not releases:
        return None
    # cuts[i]: how many releases have happened by the i-th distinct end time (where the next end differs),
    # found in C: a loop over thousands of releases was a tenth of an estimate per shape.
    ends = list(map(_END, releases))
    cuts: list[int] = list(compress(range(1, len(ends)), map(ne, ends, islice(ends, 1, None))))
    cuts.append(len(ends))

    def fits(state: FreeState) -> Fit | None:
        if state.type_free.get(gpu_type, 0) < need:
            return None
        return find_job(state, job, one_leaf=one_leaf)

    # A gang larger than a node is never searched within one node, so the copies skip the best-fit buckets.
    multi_node_only = need > st.ix.type_max_node.get(gpu_type, 0)
    # The counts know GPUs only, and leaves, not fabric domains or node capabilities: a gang that may be
    # short of cores or memory, that must stay in one fabric domain, or that needs capabilities, takes the search.
    light = st.ix.light(gpu_type, per_replica, job.cpus_per_replica, job.memory_mb_per_replica)
    if COUNT_MULTI_NODE and multi_node_only and not job.one_fabric and not job.spread and not job.needs and light:
        agreed, counted = _earliest_in_counts(st, releases, cuts, reserved, gpu_type, replicas, per_replica, one_leaf, fits)
        if agreed:
            return counted
        # The counts and the search disagreed (a bug in the counts): the galloping search decides.
    if COUNT_ONE_NODE and replicas == 1 and not job.needs and light:
        agreed, counted = _earliest_on_one_node(st, releases, cuts, reserved, gpu_type, per_replica, fits, when_only)
        if agreed:
            return counted

    cur = st.clone(buckets=not multi_node_only)
    applied = 0
    last_fail: tuple[int, FreeState] | None = None  # (cut index, state there)
    probe = 0
    found: tuple[int, Fit] | None = None
    while probe < len(cuts):
        _apply(cur, releases, applied, cuts[probe], reserved)
        applied = cuts[probe]
        fit = fits(cur)
        if fit is not None:
            found = (probe, fit)
            break
        last_fail = (probe, cur.clone())
        probe = probe * 2 + 1 if probe else 1
        if probe >= len(cuts) and last_fail[0] < len(cuts) - 1:
            probe = len(cuts) - 1
    if found is None:
        return None
    # Bisect between the last failing cut and the first fitting one.
    lo_ix, lo_state = last_fail if last_fail is not None else (-1, st.clone(buckets=not multi_node_only))
    lo_applied = cuts[lo_ix] if lo_ix >= 0 else 0
    hi_ix, hi_fit = found
    while hi_ix - lo_ix > 1:
        mid = (lo_ix + hi_ix) // 2
        trial = lo_state.clone()
        _apply(trial, releases, lo_applied, cuts[mid], reserved)
        fit = fits(trial)
        if fit is not None:
            hi_ix, hi_fit = mid, fit
        else:
            lo_ix, lo_state, lo_applied = mid, trial, cuts[mid]
    return releases[cuts[hi_ix] - 1].end, hi_fit


def _earliest_in_counts(
    st: FreeState,
    releases: list[Release],
    cuts: list[int],
    reserved: set[Loc],
    gpu_type: str,
    replicas: int,
    per_replica: int,
    one_leaf: bool,
    fits: Callable[[FreeState], Fit | None],
) -> tuple[bool, tuple[float, Fit] | None]:
    """``earliest_fit`` for a gang larger than a node, in counts: (True, its answer), or (False, None)
    if the search proves the counts wrong.

    Such a gang is never searched within one node, so it fits exactly when some leaf has as many free
    GPUs as the gang and room for its replicas (kept in one leaf), or when all leaves together have
    room for them (``placement_span._multi_node``), counted on READY nodes of its type. The ends are replayed
    in counts only (free GPUs per touched node and leaf, replica room per leaf and in all), the first
    end time too (where jobs past their time limit all end "now": giving all of them back for every
    search was most of a saturated plan's locality choices); at the first end time after which it
    fits, the GPUs freed by then are given back, only in the leaves
    where it fits if it is kept in one leaf (the other leaves fit neither here nor in the full state),
    and the search there finds the placement the full state would give.
    """
    at = st.clone(buckets=False)
    ix = at.ix
    leaves = range(len(ix.leaf_names))
    need = replicas * per_replica
    # Per leaf and per node, as lists (read and written for every GPU replayed): free GPUs of the type,
    # replica room, and the GPUs freed so far.
    leaf_free = [at.leaf_tfree[li].get(gpu_type, 0) for li in leaves]
    leaf_room = [at.leaf_capacity(li, gpu_type, per_replica) for li in leaves]
    node_free = list(at.dfree[NODE])
    total_room = sum(leaf_room)
    # Leaves that hold it already (none, where the caller's search just failed on this state).
    fitting = {li for li in leaves if leaf_free[li] >= need and leaf_room[li] >= replicas}
    freed: dict[int, list[Loc]] = {}  # leaf -> GPUs freed there by the ends replayed
    seen: set[Loc] = set()  # a GPU named by two releases is freed once
    ready = ix.ready_of_type(gpu_type)
    leaf_of = ix.leaf_of_node
    free = at.free
    c = 0
    cut = cuts[0]
    if cut > _FIRST_BY_NODE:
        # Many jobs end first, at one time (in a saturated cluster those past their time limit all end
        # "now": thousands of GPUs that every search of a plan replays). Their GPUs are counted node by
        # node, grouped once per plan (``_first_by_node``); whether a leaf fits is read at the cut only,
        # and its counts only grow.
        reserved_nodes = {ni for ni, _ in reserved}
        for ni, positions, mine in _first_by_node(ix, releases, cut, gpu_type):
            row = free[ni]
            if ni in reserved_nodes:
                mine = tuple([loc for loc in mine if not row[loc[1]] and loc not in reserved])
            elif any(map(row.__getitem__, positions)):
                mine = tuple([loc for loc in mine if not row[loc[1]]])
            if not mine:
                continue
            seen.update(mine)
            li = leaf_of[ni]
            freed.setdefault(li, []).extend(mine)
            k = len(mine)
            old = node_free[ni]
            node_free[ni] = old + k
            gained = (old + k) // per_replica - old // per_replica
            leaf_room[li] += gained
            total_room += gained
            leaf_free[li] += k
            if leaf_free[li] >= need and leaf_room[li] >= replicas:
                fitting.add(li)
        if fitting if one_leaf else total_room >= replicas:
            at.give_locs([loc for li in sorted(fitting if one_leaf else freed) for loc in freed.get(li, ())])
            fit = fits(at)
            return (True, (releases[cut - 1].end, fit)) if fit is not None else (False, None)
        c = 1
        cut = cuts[1] if len(cuts) > 1 else -1
    skip = cuts[0] if c else 0
    for i, (end, _, locs) in enumerate(islice(releases, skip, None), skip):
        for loc in locs:
            ni, p = loc
            if not ready[ni] or free[ni][p] or loc in reserved or loc in seen:
                continue  # giving it back changes nothing this search reads
            seen.add(loc)
            li = leaf_of[ni]
            got = freed.get(li)
            if got is None:
                freed[li] = [loc]
            else:
                got.append(loc)
            leaf_free[li] += 1
            old = node_free[ni]
            node_free[ni] = old + 1
            gained = (old + 1) // per_replica - old // per_replica
            if gained:
                leaf_room[li] += gained
                total_room += gained
            if leaf_free[li] >= need and leaf_room[li] >= replicas:
                fitting.add(li)
        if i + 1 == cut:  # every end up to this time is in: where the galloping search would look
            if fitting if one_leaf else total_room >= replicas:
                at.give_locs([loc for li in sorted(fitting if one_leaf else freed) for loc in freed.get(li, ())])
                fit = fits(at)
                return (True, (end, fit)) if fit is not None else (False, None)
            c += 1
            if c < len(cuts):
                cut = cuts[c]
    return True, None


# Releases at the first end time past which ``_earliest_in_counts`` counts them node by node.
_FIRST_BY_NODE = 64
_FIRST: list[tuple[TopoIndex, str, list[Release], list[tuple[int, tuple[int, ...], tuple[Loc, ...]]]]] = []


def _first_by_node(
    ix: TopoIndex, releases: list[Release], cut: int, gpu_type: str
) -> list[tuple[int, tuple[int, ...], tuple[Loc, ...]]]:
    """The GPUs of ``releases[:cut]`` on READY nodes of ``gpu_type``, once each, per node (first named
    first): (node, positions, GPUs). Kept for the next call whose first releases are equal (a plan's
    searches, and the estimates' shapes, replay the same first ends: the same objects, compared by
    identity first, so the comparison costs a pointer each)."""
    first = releases[:cut]
    if _FIRST and _FIRST[0][0] is ix and _FIRST[0][1] == gpu_type and _FIRST[0][2] == first:
        return _FIRST[0][3]
    ready = ix.ready_of_type(gpu_type)
    by_node: dict[int, list[Loc]] = {}
    for loc in dict.fromkeys(loc for _, _, locs in first for loc in locs):
        if ready[loc[0]]:
            by_node.setdefault(loc[0], []).append(loc)
    found = [(ni, tuple(p for _, p in mine), tuple(mine)) for ni, mine in by_node.items()]
    _FIRST[:] = [(ix, gpu_type, first, found)]
    return found


def _earliest_on_one_node(
    st: FreeState,
    releases: list[Release],
    cuts: list[int],
    reserved: set[Loc],
    gpu_type: str,
    per_replica: int,
    fits: Callable[[FreeState], Fit | None],
    when_only: bool = False,
) -> tuple[bool, tuple[float, Fit] | None]:
    """``earliest_fit`` for one replica (one node), in counts: (True, its answer), or (False, None) if
    the search at the time the counts give finds no fit (a rule the counts do not know: the galloping
    search decides then).

    One replica fits only on a READY node of its type with ``per_replica`` free GPUs, so no end time
    before the first one after which some node has them can fit; the ends are replayed in free GPUs per
    node only, and the search runs once, on the state with every GPU freed by then given back (the
    galloping search cloned the whole free state some twenty times per shape; the estimates of a queue
    ask one search per shape every cycle).

    ``when_only``: the search runs first on the state with only the nodes that have ``per_replica`` free
    GPUs by then given theirs back (giving back every GPU freed by then was most of an estimate of a
    whole-node shape: a thousand nodes' counts changed to search one); a replica fits there only if it
    fits on the whole state then (it fits on one node, and that node's GPUs are the same in both), so the
    time is the same; only where it does not (a rule the counts do not know) is the whole state searched.
    """
    ready = st.ix.ready_of_type(gpu_type)
    free = st.free
    node_free = st.dfree[NODE]
    enough = any(ready[ni] and k >= per_replica for ni, k in enumerate(node_free))
    counted: dict[int, int] = {}
    seen: set[Loc] = set()  # a GPU named by two releases is freed once
    c = 0
    cut = cuts[0]
    for i, (end, _, locs) in enumerate(releases):
        if not enough:
            for loc in locs:
                ni, p = loc
                if not ready[ni] or free[ni][p] or loc in reserved or loc in seen:
                    continue
                seen.add(loc)
                k = counted.get(ni)
                k = counted[ni] = (node_free[ni] if k is None else k) + 1
                if k >= per_replica:
                    enough = True
        if i + 1 == cut:
            if enough:
                if when_only:
                    at = st.clone()
                    nodes = {ni for ni, k in counted.items() if k >= per_replica}
                    at.give_locs([loc for rel in releases[:cut] for loc in rel.locs if loc[0] in nodes and loc not in reserved])
                    fit = fits(at)
                    if fit is not None:
                        return True, (end, fit)
                at = st.clone()
                _apply(at, releases, 0, cut, reserved)
                fit = fits(at)
                return (True, (end, fit)) if fit is not None else (False, None)
            c += 1
            if c < len(cuts):
                cut = cuts[c]
    return True, None
