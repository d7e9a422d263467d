"""A plan names each job once: a victim taken by one path (a due reservation's at-risk jobs) is not taken
again by another (the guarantee reclaim), and ``plan()`` checks it before it returns."""

from dataclasses import replace

import pytest

from scheduling.core.plan import check_once, plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import Config, LeafLocality, Locality, Placement, Plan, PlanError, Preemption, RunningJob, Tier

# Two leaves of four 8-GPU nodes: leaf-0 = n000..n003, leaf-1 = n004..n007.
TOPO = cluster(nodes_per_leaf=4, leaves_per_spine=2)
NOW = 10_000.0
AT_RISK = Config(backfill_at_risk=True)


def tier_1(job_id: str, node: str, *, ends: float) -> RunningJob:
    return running(job_id, [gpu_ids(TOPO, node)], team="prod", tier=Tier.PRODUCTION, start=0.0, time_limit=ends)


# leaf-0: n000, n002, n003 are Tier 1 work ending now; n001 is half of "spanner", a spot gang that
# started at risk an hour ago across both leaves (n001 + n004). leaf-1's other nodes are Tier 1 for long.
SPANNER = replace(
    running(
        "spanner",
        [gpu_ids(TOPO, "n001"), gpu_ids(TOPO, "n004")],
        team="team-b",
        tier=Tier.SPOT,
        start=NOW - 3600.0,
        time_limit=90_000.0,
    ),
    at_risk=True,
)
RUNNING = [
    tier_1("r0", "n000", ends=NOW),
    tier_1("r2", "n002", ends=NOW),
    tier_1("r3", "n003", ends=NOW),
    SPANNER,
    *(tier_1(f"f{i}", f"n00{i}", ends=90_000.0) for i in (5, 6, 7)),
]
# team-a's guarantee (16) holds "one" (8 GPUs) but not "gang" (32): the gang borrows, so it may not
# preempt and reserves leaf-0 instead, due within the grace period (at-risk jobs count as gone by then):
# it preempts "spanner". Then "one", within the guarantee, reclaims: the first reclaim of the plan.
GANG = replace(pending("gang", 4, 8, team="team-a", submit_time=0.0), locality=LeafLocality.REQUIRED)
ONE = pending("one", 1, 8, team="team-a", submit_time=1.0)
QUOTAS = quota_tree({"team-a": {"H100": 16}, "team-b": {"H100": 0}, "prod": {"H100": 48}})


def plan_it():
    return plan(snapshot(TOPO, running=RUNNING, pending=[GANG, ONE], quotas=QUOTAS, config=AT_RISK), now=NOW)


def test_a_victim_of_a_due_reservation_is_not_reclaimed_again_in_the_same_plan():
    result = plan_it()
    assert [(p.job_id, p.for_job) for p in result.preemptions] == [("spanner", "gang")]
    assert "preempting at-risk job(s) spanner" in result.pending_reasons["gang"]
    # Its GPUs on n004 come free with that one stop: "one" does not reclaim it a second time, nor hold n004.
    assert [r.job_id for r in result.reservations] == ["gang"]
    assert "spanner" not in result.pending_reasons["one"]


def test_the_reclaim_still_takes_the_at_risk_job_when_no_reservation_took_it():
    # Without the gang nobody reserves: "one" reclaims the spot gang for one of its nodes, once.
    result = plan(snapshot(TOPO, running=RUNNING, pending=[ONE], quotas=QUOTAS, config=AT_RISK), now=NOW)
    assert [(p.job_id, p.for_job) for p in result.preemptions] == [("spanner", "one")]
    (res,) = result.reservations
    assert set(res.gpus) in (set(gpu_ids(TOPO, "n001")), set(gpu_ids(TOPO, "n004")))


# The check plan() makes before it returns (``check_once``): a plan that names a job twice is refused.

PLACED = Placement("solo", (gpu_ids(TOPO, "n000"),), ("n000",), Locality.NODE, leaves=1, spines=1, borrowed=False)


def a_plan(placements=(), preemptions=()) -> Plan:
    return Plan(placements=tuple(placements), preemptions=tuple(preemptions), reservations=(), pending_reasons={})


def stop(job_id: str, for_job: str) -> Preemption:
    return Preemption(job_id, f"for {for_job}", grace_s=60.0, for_job=for_job)


def test_the_check_refuses_a_job_preempted_twice():
    with pytest.raises(PlanError, match=r"preempts job spanner twice \(for job gang and for job one\)"):
        check_once(a_plan(preemptions=[stop("spanner", "gang"), stop("spanner", "one")]), tuple(RUNNING))


def test_the_check_refuses_a_victim_that_is_already_stopping_or_not_running():
    stopping = tuple(replace(j, terminating=True) if j.job_id == "spanner" else j for j in RUNNING)
    with pytest.raises(PlanError, match="preempts job spanner, which is not running or already stopping"):
        check_once(a_plan(preemptions=[stop("spanner", "gang")]), stopping)
    with pytest.raises(PlanError, match="preempts job ghost, which is not running"):
        check_once(a_plan(preemptions=[stop("ghost", "gang")]), tuple(RUNNING))


def test_the_check_refuses_a_job_placed_twice():
    with pytest.raises(PlanError, match="places job solo twice"):
        check_once(a_plan(placements=[PLACED, PLACED]), ())


def test_the_check_refuses_a_job_placed_and_preempted():
    solo = running("solo", [gpu_ids(TOPO, "n001")], start=0.0, time_limit=90_000.0)
    with pytest.raises(PlanError, match="places job solo and preempts it"):
        check_once(a_plan(placements=[PLACED], preemptions=[stop("solo", "x")]), (solo,))


def test_the_check_passes_the_plans_plan_makes():
    result = plan_it()
    check_once(result, tuple(RUNNING))
    assert result.preemptions
