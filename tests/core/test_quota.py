"""Quotas: guarantees, limits up the tree, borrowing and the borrowed mark."""

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import QuotaUnit, Tier

TOPO = cluster(nodes_per_leaf=4)  # 32 H100


def test_tier_1_beyond_guarantee_is_not_placed_and_says_why():
    quotas = quota_tree({"vision": {"H100": 8}})
    busy = [running("r1", [gpu_ids(TOPO, "n000")], team="vision", tier=Tier.PRODUCTION)]
    job = pending("j", 1, 8, team="vision", tier=Tier.PRODUCTION)
    result = plan(snapshot(TOPO, running=busy, pending=[job], quotas=quotas), now=0.0)
    assert result.placements == ()
    assert result.pending_reasons["j"].startswith("Tier 1 runs only within guarantee")


def test_tier_1_within_guarantee_is_placed_in_quota():
    quotas = quota_tree({"vision": {"H100": 16}})
    job = pending("j", 1, 8, team="vision", tier=Tier.PRODUCTION)
    result = plan(snapshot(TOPO, pending=[job], quotas=quotas), now=0.0)
    assert [p.borrowed for p in result.placements] == [False]


def test_team_limit_stops_borrowing_and_says_so():
    quotas = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 16}})
    busy = [running("r1", [gpu_ids(TOPO, "n000"), gpu_ids(TOPO, "n001")], team="vision")]
    result = plan(snapshot(TOPO, running=busy, pending=[pending("j", 1, 1, team="vision")], quotas=quotas), now=0.0)
    assert result.placements == ()
    assert result.pending_reasons["j"].startswith("over team vision quota for H100 (16/8 guaranteed, limit 16")


def test_ancestor_limit_applies_to_its_teams():
    quotas = [
        QuotaUnit("root", None),
        QuotaUnit("research", "root", limit={"H100": 8}),
        QuotaUnit("vision", "research"),
    ]
    jobs = [pending("a", 1, 8, team="vision"), pending("b", 1, 1, team="vision")]
    result = plan(snapshot(TOPO, pending=jobs, quotas=quotas), now=0.0)
    assert [p.job_id for p in result.placements] == ["a"]
    assert "parent unit research" in result.pending_reasons["b"]


def test_work_beyond_guarantee_is_placed_as_borrowed():
    quotas = quota_tree({"vision": {"H100": 8}})
    jobs = [pending("in", 1, 8, team="vision"), pending("over", 1, 8, team="vision", submit_time=1.0)]
    result = plan(snapshot(TOPO, pending=jobs, quotas=quotas), now=0.0)
    assert {p.job_id: p.borrowed for p in result.placements} == {"in": False, "over": True}


def test_no_guarantee_entry_means_guarantee_zero():
    quotas = quota_tree({"vision": {"A100": 64}})
    result = plan(snapshot(TOPO, pending=[pending("j", 1, 1, team="vision")], quotas=quotas), now=0.0)
    assert result.placements[0].borrowed is True


def test_running_jobs_beyond_guarantee_are_marked_borrowed_newest_first():
    quotas = quota_tree({"vision": {"H100": 8}})
    busy = [
        running("old", [gpu_ids(TOPO, "n000")], team="vision", start=0.0),
        running("new", [gpu_ids(TOPO, "n001")], team="vision", start=100.0),
    ]
    result = plan(snapshot(TOPO, running=busy, quotas=quotas), now=200.0)
    assert result.borrowed == {"old": False, "new": True}


def test_unknown_team_gets_a_reason():
    quotas = quota_tree({"vision": {"H100": 8}})
    result = plan(snapshot(TOPO, pending=[pending("j", team="ghost")], quotas=quotas), now=0.0)
    assert "not in the quota tree" in result.pending_reasons["j"]
