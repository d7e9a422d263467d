"""Ordering: tiers first, then hierarchical fair share (Fair Tree, DRF), then priority, submit time, id."""

import pytest

from scheduling.core.fairshare import accrue, decay, team_order
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, merge, pending, quota_tree, snapshot
from scheduling.core.types import QuotaUnit, Tier

ONE_NODE = cluster(nodes_per_leaf=1)


def winner(pendings, quotas=None):
    """Which job gets the only node, when every job wants all of it."""
    result = plan(snapshot(ONE_NODE, pending=pendings, quotas=quotas), now=0.0)
    assert len(result.placements) == 1
    return result.placements[0].job_id


def test_decay_halves_usage_after_one_half_life():
    assert decay(100.0, 3600.0, 3600.0) == pytest.approx(50.0)


def test_decay_leaves_usage_unchanged_after_no_time():
    assert decay(100.0, 0.0, 3600.0) == 100.0


def test_accrue_adds_less_than_raw_gpu_seconds_as_it_decays():
    assert 0 < accrue(0.0, 8, 3600.0, 7 * 86400.0) < 8 * 3600.0


def test_tier_1_goes_before_tier_2_and_tier_3():
    jobs = [
        pending("t3", tier=Tier.SPOT),
        pending("t2", tier=Tier.RESEARCH),
        pending("t1", tier=Tier.PRODUCTION, submit_time=99.0),
    ]
    assert winner(jobs) == "t1"


def test_tier_2_goes_before_tier_3():
    assert winner([pending("t3", tier=Tier.SPOT), pending("t2", tier=Tier.RESEARCH, submit_time=5.0)]) == "t2"


def test_team_with_less_decayed_usage_goes_first():
    quotas = quota_tree({"heavy": {}, "light": {}}, usage={"heavy": {"H100": 1e6}, "light": {"H100": 1e3}})
    jobs = [pending("h", team="heavy"), pending("l", team="light", submit_time=50.0)]
    assert winner(jobs, quotas) == "l"


def test_weight_scales_a_teams_share():
    quotas = [
        QuotaUnit("root", None),
        QuotaUnit("big", "root", usage={"H100": 300.0}, weight=4.0),
        QuotaUnit("small", "root", usage={"H100": 100.0}, weight=1.0),
    ]
    jobs = [pending("s", team="small"), pending("b", team="big", submit_time=9.0)]
    assert winner(jobs, quotas) == "b"


def test_fair_tree_orders_departments_before_their_teams():
    # dept-a used little in total, so its heavier team still goes before dept-b's idle team.
    quotas = [
        QuotaUnit("root", None),
        QuotaUnit("dept-a", "root"),
        QuotaUnit("dept-b", "root"),
        QuotaUnit("a1", "dept-a", usage={"H100": 50.0}),
        QuotaUnit("b1", "dept-b", usage={"H100": 0.0}),
        QuotaUnit("b2", "dept-b", usage={"H100": 500.0}),
    ]
    rank = team_order(quotas, {"H100": 8})
    assert rank["a1"] < rank["b1"] < rank["b2"]


def test_dominant_share_compares_teams_across_gpu_types():
    # team x used 10% of the small A100 pool, team y 5% of the large H100 pool: y is lower.
    capacity = {"H100": 1000, "A100": 10}
    quotas = [
        QuotaUnit("root", None),
        QuotaUnit("x", "root", usage={"A100": 1.0, "H100": 1.0}),
        QuotaUnit("y", "root", usage={"H100": 50.0}),
    ]
    rank = team_order(quotas, capacity)
    assert rank["y"] < rank["x"]


def test_within_a_team_higher_priority_goes_first():
    assert winner([pending("low", submit_time=0.0), pending("high", submit_time=9.0, priority=5)]) == "high"


def test_within_a_team_and_priority_earlier_submit_goes_first():
    assert winner([pending("late", submit_time=9.0), pending("early", submit_time=1.0)]) == "early"


def test_job_id_breaks_the_last_tie():
    assert winner([pending("b"), pending("a")]) == "a"


def test_gpu_types_are_planned_independently():
    topo = merge(cluster(nodes_per_leaf=1, prefix="h"), cluster(nodes_per_leaf=1, gpu_type="A100", prefix="a"))
    jobs = [pending("h1"), pending("h2"), pending("a1", gpu_type="A100", submit_time=5.0)]
    result = plan(snapshot(topo, pending=jobs), now=0.0)
    assert {p.job_id for p in result.placements} == {"h1", "a1"}


def test_work_within_guarantee_goes_before_borrowing_work_of_a_lighter_team():
    quotas = quota_tree(
        {"owner": {"H100": 8}, "light": {}},
        usage={"owner": {"H100": 1e6}, "light": {"H100": 0.0}},
    )
    jobs = [pending("borrow", team="light"), pending("mine", team="owner", submit_time=50.0)]
    assert winner(jobs, quotas) == "mine"


def test_only_the_jobs_that_fit_the_guarantee_count_as_within_it():
    quotas = quota_tree({"owner": {"H100": 8}, "light": {}}, usage={"owner": {"H100": 1e6}})
    jobs = [
        pending("mine-1", 1, 4, team="owner"),
        pending("mine-2", 1, 4, team="owner", submit_time=1.0),
        pending("mine-3", 1, 4, team="owner", submit_time=2.0),
        pending("borrow", 1, 4, team="light", submit_time=3.0),
    ]
    result = plan(snapshot(cluster(nodes_per_leaf=1, gpus_per_node=12), pending=jobs, quotas=quotas), now=0.0)
    assert {p.job_id for p in result.placements} == {"mine-1", "mine-2", "borrow"}
