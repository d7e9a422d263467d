"""A plan names each job once, whatever the locality mode: no job preempted twice, placed twice, or both.

Checked here independently of ``plan.check_once`` (the plan's own check), over random states run under
every ``LeafLocality`` given to every pending job, and spanning costs of 0 and 25 %. The crowded states
are where the paths that preempt meet: a full cluster with at-risk gangs across leaves, a reservation
coming due, and teams both within their guarantee (they reclaim) and beyond it (they reserve).
"""

from collections import Counter
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, pending, quota_tree
from scheduling.core.types import Config, LeafLocality, PendingJob, Plan, PlanError, RunningJob, Snapshot, Tier
from tests.property.strategies import NOW, TEAMS, snapshots

MODES = tuple(LeafLocality)
SLOWDOWNS = (0.0, 0.25)


def assert_names_each_job_once(snap: Snapshot, result: Plan) -> None:
    preempted = Counter(p.job_id for p in result.preemptions)
    placed = Counter(p.job_id for p in result.placements)
    assert not [j for j, n in preempted.items() if n > 1], f"preempted twice: {result.preemptions}"
    assert not [j for j, n in placed.items() if n > 1], f"placed twice: {placed}"
    assert not set(preempted) & set(placed), f"placed and preempted: {set(preempted) & set(placed)}"
    stoppable = {j.job_id for j in snap.running if not j.terminating}
    assert set(preempted) <= stoppable, f"not running or already stopping: {set(preempted) - stoppable}"


def every_mode(snap: Snapshot) -> None:
    for mode in MODES:
        for slowdown in SLOWDOWNS:
            s = replace(
                snap,
                pending=tuple(replace(j, locality=mode) for j in snap.pending),
                config=replace(snap.config, span_slowdown=slowdown),
            )
            try:
                result = plan(s, now=NOW)
            except PlanError as e:  # the plan's own check caught it: this property's failure too
                raise AssertionError(f"{mode}, span slowdown {slowdown}: {e}") from e
            assert_names_each_job_once(s, result)


@st.composite
def crowded(draw: st.DrawFn) -> Snapshot:
    """A full cluster of 8-GPU nodes (2-3 leaves) where the paths that preempt meet.

    Running: whole-node jobs and gangs, some across leaves, often at risk and old enough to be victims,
    some ending now (so a reservation comes due), of every tier. Pending: a team beyond its guarantee
    (its jobs may not preempt: they reserve) and a team within it whose queue begins with a gang that
    passes it (so its later jobs are ordered with the borrowers, yet may reclaim), and sometimes others.
    """
    topo = cluster(nodes_per_leaf=draw(st.integers(2, 4)), leaves_per_spine=draw(st.integers(2, 3)))
    order = draw(st.permutations([n.name for n in topo.nodes]))
    left = list(order[draw(st.integers(0, 1)) :])  # the nodes running jobs fill
    gpus = {n.name: tuple(g.id for g in n.gpus) for n in topo.nodes}
    busy: list[RunningJob] = []
    while left:
        size = min(draw(st.sampled_from([1, 1, 2, 2, 3])), len(left))
        nodes, left = left[:size], left[size:]
        half = size == 1 and draw(st.booleans())
        start = NOW - draw(st.sampled_from([60.0, 3600.0, 20_000.0]))
        ends_now = draw(st.integers(0, 3)) == 0
        busy.append(
            RunningJob(
                job_id=f"r{len(busy)}",
                team=draw(st.sampled_from(["t0", "t0", "t2", "t3"])),  # t1 has its guarantee free
                tier=draw(st.sampled_from([Tier.PRODUCTION, Tier.RESEARCH, Tier.RESEARCH, Tier.SPOT, Tier.SPOT])),
                gpu_type="H100",
                replicas=tuple(gpus[n][:4] if half else gpus[n] for n in nodes),
                start=start,
                time_limit=NOW - start if ends_now else draw(st.sampled_from([50_000.0, 200_000.0])),
                terminating=draw(st.integers(0, 7)) == 0,
                at_risk=draw(st.booleans()),
            )
        )

    waiting: list[PendingJob] = []

    def job(team: str, replicas: int, submit_time: float | None = None) -> PendingJob:
        return pending(
            f"p{len(waiting)}",
            replicas,
            8 if replicas > 1 else draw(st.sampled_from([4, 8])),
            team=team,
            tier=draw(st.sampled_from([Tier.PRODUCTION, *[Tier.RESEARCH] * 8, Tier.SPOT])),
            submit_time=draw(st.floats(1, 100)) if submit_time is None else submit_time,
            time_limit=draw(st.sampled_from([600.0, 7200.0, 100_000.0])),
        )

    for _ in range(draw(st.integers(1, 2))):
        waiting.append(job("t0", draw(st.sampled_from([1, 2, 3, 4]))))
    waiting.append(job("t1", draw(st.integers(3, 4)), submit_time=0.0))  # first in t1's queue, beyond its guarantee
    for _ in range(draw(st.integers(1, 3))):
        waiting.append(job("t1", 1))
    for _ in range(draw(st.integers(0, 2))):
        waiting.append(job(draw(st.sampled_from(["t2", "t3"])), draw(st.sampled_from([1, 1, 2]))))
    guarantees = {
        "t0": {"H100": draw(st.sampled_from([0, 8]))},
        "t1": {"H100": draw(st.sampled_from([8, 16]))},
        "t2": {"H100": draw(st.sampled_from([0, 8]))},
        "t3": {"H100": 0},
    }
    usage = {t: {"H100": draw(st.sampled_from([0.0, 1e5]))} for t in TEAMS}  # either team may rank first
    config = Config(
        backfill_at_risk=True,
        max_reservations=draw(st.integers(1, 2)),
        max_reclaims=draw(st.sampled_from([1, 8])),
    )
    return Snapshot(topo, tuple(busy), tuple(waiting), quota_tree(guarantees, usage=usage), config)


@settings(max_examples=300, deadline=None)
@given(crowded())
def test_a_crowded_plan_names_each_job_once_in_every_locality_mode(snap):
    every_mode(snap)


@settings(max_examples=60, deadline=None)
@given(snapshots())
def test_any_plan_names_each_job_once_in_every_locality_mode(snap):
    every_mode(snap)
