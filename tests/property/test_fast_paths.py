"""The core's fast paths plan exactly as the plainer code they replaced (kept here as the reference).

Each optimisation of ``scheduling/core`` that has a slower twin is swapped back to that twin by
``reference_core()``; every plan must then come out equal, field by field, on random snapshots and on
snapshots built to make reservations lend their GPUs (the EASY backfill path the one-node lending
shortcut serves).
"""

import contextlib
from collections.abc import Iterator

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import backfill, placement
from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE, NVLINK, PCIE
from scheduling.core.placement_fit import Fit
from scheduling.core.placement_node import _pick_in_domain
from scheduling.core.plan import _Planner, plan
from scheduling.core.preemption import Reclaimer
from scheduling.core.quota import QuotaState, limit_words
from scheduling.core.testing import cluster, gpu_ids, pending, running, snapshot
from scheduling.core.types import Config, Locality, Node, PendingJob, QuotaUnit, RunningJob, Snapshot, Tier, Topology
from tests.property.strategies import NOW, TEAMS, snapshots

FAST = settings(max_examples=150, deadline=None)


# --------------------------------------------------------------------------- the reference twins


def _apply_job_by_job(st: FreeState, releases, start, stop, reserved) -> None:
    for rel in releases[start:stop]:
        st.give_locs(loc for loc in rel.locs if loc not in reserved)


def _single_node_always_picking(st: FreeState, gpu_type, replicas, per_replica, max_node):
    ix = st.ix
    need = replicas * per_replica
    for level in (NVLINK, PCIE, NODE):
        found = st.best_domain(gpu_type, level, need, max_node)
        if found is None:
            continue
        d = found[0]
        ni = ix.dom_node[level][d]
        positions = _pick_in_domain(st, ni, level, d, need)
        reps = tuple((ni, tuple(positions[i * per_replica : (i + 1) * per_replica])) for i in range(replicas))
        return Fit(reps, Locality(level), ix.nodes[ni].name, 1, 1)
    return None


def _within_guarantee_walking(self: QuotaState, team, gpu_type, n, tier) -> bool:
    return team in self.units and self.claimed(team, gpu_type, tier) + n <= self.guaranteed(team, gpu_type)


def _blocked_walking(self: QuotaState, job: PendingJob):
    t, n = job.gpu_type, job.gpu_count
    if job.team not in self.units:
        return f"team {job.team} is not in the quota tree; ask an admin to add it"
    if job.tier == Tier.PRODUCTION and not self.within_guarantee(job.team, t, n, Tier.PRODUCTION):
        held, g = self.claimed(job.team, t, Tier.PRODUCTION), self.guaranteed(job.team, t)
        return f"Tier 1 runs only within guarantee: team {job.team}'s Tier 1 jobs hold {held}/{g} guaranteed {t}, needs {n} more"
    for name in self.chain(job.team):
        limit = self.units[name].limit.get(t)
        if limit is not None and self.held_of(name, t) + n > limit:
            held, g = self.held_of(name, t), self.guaranteed(name, t)
            who = "team" if name == job.team else "parent unit"
            return f"over {who} {name} quota for {t} ({held}/{g} guaranteed, {limit_words(limit, held, n, t)})"
    return None


@contextlib.contextmanager
def reference_core() -> Iterator[None]:
    saved = (
        _Planner.lend_to_one_node,
        _Planner.count_takeable,
        Reclaimer.count_in_one_leaf,
        backfill.COUNT_MULTI_NODE,
        backfill.COUNT_ONE_NODE,
        backfill._apply,
        placement._single_node,
        QuotaState.within_guarantee,
        QuotaState.blocked,
    )
    _Planner.lend_to_one_node = False
    _Planner.count_takeable = False
    backfill.COUNT_MULTI_NODE = False
    backfill.COUNT_ONE_NODE = False
    Reclaimer.count_in_one_leaf = False
    backfill._apply = _apply_job_by_job
    placement._single_node = _single_node_always_picking
    QuotaState.within_guarantee = _within_guarantee_walking
    QuotaState.blocked = _blocked_walking
    try:
        yield
    finally:
        (
            _Planner.lend_to_one_node,
            _Planner.count_takeable,
            Reclaimer.count_in_one_leaf,
            backfill.COUNT_MULTI_NODE,
            backfill.COUNT_ONE_NODE,
            backfill._apply,
            placement._single_node,
            QuotaState.within_guarantee,
            QuotaState.blocked,
        ) = saved


def reference_plan(snap: Snapshot, now: float):
    with reference_core():
        return plan(snap, now=now)


def fast_plan(snap: Snapshot, now: float, *, first_by_node: bool = False, check_prefix: bool = True):
    """plan() with the fast paths, failing if a counted search ever had to fall back to the plain one
    (its counts said a gang fits, the search said no): that would be a bug in the counts, harmless to
    the decisions but invisible without this check. ``first_by_node``: the counted search counts its
    first end time node by node however few jobs end then (it does from ``backfill._FIRST_BY_NODE``
    jobs on, more than these small snapshots hold)."""
    plain, counted, one_node = Reclaimer._prefix_plain, backfill._earliest_in_counts, backfill._earliest_on_one_node

    def no_fallback(self, st, job, usable, one_leaf):
        if check_prefix:
            assert not (one_leaf and job.gpu_count > self.ix.type_max_node.get(job.gpu_type, 0)), "counted prefix fell back"
        return plain(self, st, job, usable, one_leaf)

    def agreeing(*args):
        agreed, found = counted(*args)
        assert agreed, "counted earliest fit fell back"
        return agreed, found

    def agreeing_on_one_node(*args):
        agreed, found = one_node(*args)
        assert agreed, "counted earliest fit on one node fell back"
        return agreed, found

    Reclaimer._prefix_plain, backfill._earliest_in_counts = no_fallback, agreeing
    backfill._earliest_on_one_node = agreeing_on_one_node
    threshold = backfill._FIRST_BY_NODE
    if first_by_node:
        backfill._FIRST_BY_NODE = 0
    try:
        return plan(snap, now=now)
    finally:
        Reclaimer._prefix_plain, backfill._earliest_in_counts, backfill._earliest_on_one_node = plain, counted, one_node
        backfill._FIRST_BY_NODE = threshold


# --------------------------------------------------------------------------- snapshots that lend


@st.composite
def lending_snapshots(draw: st.DrawFn) -> Snapshot:
    """Part-busy clusters whose queue starts with gangs that get reservations, then many short jobs that
    may run on the reserved GPUs before the reservations start (and long ones that may not)."""
    topo: Topology = cluster(
        nodes_per_leaf=draw(st.integers(2, 4)),
        leaves_per_spine=draw(st.integers(1, 3)),
        gpus_per_node=draw(st.sampled_from([4, 8])),
        nvlink_domains=draw(st.sampled_from([1, 2])),
    )
    size = len(topo.nodes[0].gpus)
    busy: list[RunningJob] = []
    for n in topo.nodes:
        taken = draw(st.integers(0, size))
        if taken:
            busy.append(
                RunningJob(
                    job_id=f"r-{n.name}",
                    team=draw(st.sampled_from(TEAMS)),
                    tier=draw(st.sampled_from(list(Tier))),
                    gpu_type="H100",
                    replicas=(gpu_ids(topo, n.name, range(taken)),),
                    start=NOW - 1000.0,
                    time_limit=draw(st.floats(1500.0, 50_000.0)),
                )
            )
    jobs = [
        pending(f"gang{i}", draw(st.integers(2, len(topo.nodes))), size, team=draw(st.sampled_from(TEAMS)), submit_time=i)
        for i in range(draw(st.integers(1, 3)))
    ]
    for i in range(draw(st.integers(1, 25))):
        jobs.append(
            pending(
                f"small{i:02d}",
                draw(st.integers(1, 2)),
                draw(st.sampled_from([1, 2, 4, size])),
                team=draw(st.sampled_from(TEAMS)),
                submit_time=10.0 + i,
                time_limit=draw(st.sampled_from([300.0, 1200.0, 5000.0, 80_000.0])),
            )
        )
    units = (QuotaUnit("root", None), *(QuotaUnit(t, "root", guaranteed={"H100": draw(st.integers(0, 64))}) for t in TEAMS))
    config = Config(max_reservations=draw(st.integers(1, 3)), preemption=draw(st.booleans()))
    return Snapshot(topo, tuple(busy), tuple(jobs), units, config)


@st.composite
def reclaim_snapshots(draw: st.DrawFn) -> Snapshot:
    """Busy clusters of small spot and research jobs, and in-guarantee gangs of whole (or half) nodes that
    fit one leaf only by preempting: the victim search that counts freed GPUs per leaf."""
    nodes_per_leaf = draw(st.integers(2, 4))
    topo: Topology = cluster(
        nodes_per_leaf=nodes_per_leaf,
        leaves_per_spine=draw(st.integers(1, 3)),
        spines=draw(st.integers(1, 2)),
        gpus_per_node=8,
        nvlink_domains=draw(st.sampled_from([1, 2])),
    )
    drained = draw(st.sets(st.sampled_from([n.name for n in topo.nodes]), max_size=1))
    topo = Topology(
        nodes=tuple(Node(n.name, n.leaf, n.spine, n.gpu_type, n.gpus, schedulable=n.name not in drained) for n in topo.nodes)
    )
    busy: list[RunningJob] = []
    for n in topo.nodes:
        at = 0
        while at < 8 and draw(st.integers(0, 9)) > 0:
            size = min(draw(st.sampled_from([1, 1, 2, 4])), 8 - at)
            busy.append(
                RunningJob(
                    job_id=f"r-{n.name}-{at}",
                    team=draw(st.sampled_from(TEAMS)),
                    tier=draw(st.sampled_from([Tier.SPOT] * 4 + [Tier.RESEARCH] * 3 + [Tier.PRODUCTION])),
                    gpu_type="H100",
                    replicas=(gpu_ids(topo, n.name, range(at, at + size)),),
                    start=draw(st.floats(NOW - 50_000.0, NOW - 700.0)),
                    time_limit=draw(st.floats(1000.0, 100_000.0)),
                    last_checkpoint=draw(st.none() | st.floats(NOW - 50_000.0, NOW)),
                    terminating=draw(st.integers(0, 9)) == 0,
                )
            )
            at += size
    jobs = [
        pending(
            f"gang{i}",
            draw(st.integers(2, nodes_per_leaf * 2)),
            draw(st.sampled_from([8, 8, 4])),
            team=draw(st.sampled_from(TEAMS)),
            tier=draw(st.sampled_from([Tier.PRODUCTION, Tier.RESEARCH])),
            submit_time=float(i),
        )
        for i in range(draw(st.integers(1, 4)))
    ]
    units = (QuotaUnit("root", None), *(QuotaUnit(t, "root", guaranteed={"H100": draw(st.integers(0, 96))}) for t in TEAMS))
    return Snapshot(topo, tuple(busy), tuple(jobs), units, Config(max_reservations=draw(st.integers(1, 2))))


# --------------------------------------------------------------------------- the properties


@FAST
@given(snapshots())
def test_fast_paths_plan_as_the_reference_on_random_snapshots(snap):
    assert fast_plan(snap, NOW) == reference_plan(snap, NOW)


@FAST
@given(lending_snapshots())
def test_fast_paths_plan_as_the_reference_when_reservations_lend_gpus(snap):
    assert fast_plan(snap, NOW) == reference_plan(snap, NOW)


@FAST
@given(reclaim_snapshots())
def test_fast_paths_plan_as_the_reference_when_gangs_reclaim_a_leaf(snap):
    assert fast_plan(snap, NOW) == reference_plan(snap, NOW)


@FAST
@given(st.one_of(snapshots(), reclaim_snapshots()))
def test_first_end_counted_node_by_node_plans_as_the_reference(snap):
    # Every counted search counts its first end time node by node (the plans of a saturated cluster do).
    # Only the counted earliest fit is held to its no-fallback check here: the reclaim's counted prefix
    # has one of its own above.
    assert fast_plan(snap, NOW, first_by_node=True, check_prefix=False) == reference_plan(snap, NOW)


def test_one_node_lending_places_a_short_job_on_held_gpus_as_the_reference_does():
    # n001 frees first (NOW + 2400), so "big" reserves it and holds its 4 free GPUs; "long" may not use
    # them (it would end after the reservation starts), "short" may (EASY), and the one-node lending path
    # must place it exactly where lending every held GPU would.
    topo = cluster(nodes_per_leaf=2)
    busy = [
        running("busy0", [gpu_ids(topo, "n000")], start=0.0, time_limit=NOW + 4800),
        running("busy1", [gpu_ids(topo, "n001", range(4))], start=0.0, time_limit=NOW + 2400),
    ]
    jobs = [
        pending("big", 1, 8),
        pending("long", 1, 2, submit_time=1.0, time_limit=99_999.0),
        pending("short", 1, 2, submit_time=2.0, time_limit=600.0),
    ]
    snap = snapshot(topo, running=busy, pending=jobs)
    fast = plan(snap, now=NOW)
    assert fast == reference_plan(snap, NOW)
    (held,) = [set(r.gpus) for r in fast.reservations if r.job_id == "big"]
    assert [p.job_id for p in fast.placements] == ["short"]
    assert set(fast.placements[0].replicas[0]) <= held


def test_reference_core_puts_the_fast_paths_back():
    with reference_core():
        assert (_Planner.lend_to_one_node, Reclaimer.count_in_one_leaf, backfill.COUNT_MULTI_NODE, backfill.COUNT_ONE_NODE) == (
            False,
        ) * 4
        assert backfill._apply is _apply_job_by_job
        assert _Planner.count_takeable is False
    assert _Planner.count_takeable is True
    assert (_Planner.lend_to_one_node, Reclaimer.count_in_one_leaf, backfill.COUNT_MULTI_NODE, backfill.COUNT_ONE_NODE) == (
        True,
    ) * 4
    assert backfill._apply is not _apply_job_by_job
