"""A team's guarantee is claimed in tier order: Tier 1 first, then Tier 2, then Tier 3.

So a team's own spot and research work never blocks its Tier 1 work: a Tier 1 job whose team's
Tier 1 work fits the guarantee preempts what it needs of its team's lower tiers (and of other
teams' borrowed work), also where a limit of its team or an ancestor is what stands in the way.
"""

from dataclasses import replace

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import Config, QuotaUnit, Tier

TOPO = cluster(nodes_per_leaf=2)  # n000, n001: 16 H100
NOW = 100_000.0
P, R, S = Tier.PRODUCTION, Tier.RESEARCH, Tier.SPOT


def plan_with(busy, jobs, quotas, config=None):
    return plan(snapshot(TOPO, running=busy, pending=jobs, quotas=quotas, config=config), now=NOW)


def node_job(job_id, node, *, team="align", tier=S, start=0.0, **kw):
    return running(job_id, [gpu_ids(TOPO, node)], team=team, tier=tier, start=start, **kw)


def test_own_spot_work_inside_the_guarantee_is_not_borrowed():
    quotas = quota_tree({"align": {"H100": 16}})
    result = plan_with([node_job("s1", "n000"), node_job("s2", "n001", start=1.0)], [], quotas)
    assert result.borrowed == {"s1": False, "s2": False}


def test_tier_1_job_preempts_its_own_teams_spot_job_that_fills_the_guarantee():
    quotas = quota_tree({"align": {"H100": 16}})
    busy = [node_job("prod", "n000", tier=P), node_job("spot", "n001")]
    result = plan_with(busy, [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert [(p.job_id, p.for_job) for p in result.preemptions] == [("spot", "t1")]
    assert result.pending_reasons["t1"].startswith("preempting 1 job(s) (spot) to free n001")


def test_tier_1_beyond_its_tier_1_work_in_the_guarantee_still_waits():
    quotas = quota_tree({"align": {"H100": 8}})
    busy = [node_job("prod", "n000", tier=P), node_job("spot", "n001")]
    result = plan_with(busy, [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert result.preemptions == ()
    assert result.pending_reasons["t1"] == (
        "Tier 1 runs only within guarantee: team align's Tier 1 jobs hold 8/8 guaranteed H100, needs 8 more"
    )


def test_a_tier_1_placement_beside_own_spot_work_is_not_borrowed():
    quotas = quota_tree({"align": {"H100": 8}})
    result = plan_with([node_job("spot", "n000")], [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert [(p.job_id, p.borrowed) for p in result.placements] == [("t1", False)]


def test_a_team_limit_full_of_its_own_spot_work_is_made_room_in_for_tier_1():
    # Free GPUs are there (n001), but the team's limit (8) is held by its own spot job: the spot job goes,
    # and the Tier 1 job waits on the free node for it rather than run above the limit meanwhile.
    quotas = quota_tree({"align": {"H100": 8}}, limits={"align": {"H100": 8}})
    result = plan_with([node_job("spot", "n000")], [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert result.placements == ()
    assert [p.job_id for p in result.preemptions] == ["spot"]
    (res,) = result.reservations
    assert (res.job_id, set(res.gpus)) == ("t1", set(gpu_ids(TOPO, "n001")))
    assert result.pending_reasons["t1"] == (
        "preempting 1 job(s) (spot) to bring team align back under its H100 limit (n001 held for it); starts in ~60 s"
    )


def test_a_parent_limit_held_by_a_siblings_borrowed_work_is_reclaimed_for_tier_1():
    quotas = (
        QuotaUnit("root", None),
        QuotaUnit("dept", "root", guaranteed={"H100": 8}, limit={"H100": 8}),
        QuotaUnit("align", "dept", guaranteed={"H100": 8}),
        QuotaUnit("other", "dept", guaranteed={"H100": 0}),
    )
    busy = [node_job("borrowing", "n000", team="other", tier=R)]
    result = plan_with(busy, [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert [p.job_id for p in result.preemptions] == ["borrowing"]
    assert "bring unit dept back under its H100 limit" in result.pending_reasons["t1"]


def test_a_limit_held_by_tier_1_work_is_not_reclaimed():
    quotas = quota_tree({"align": {"H100": 16}}, limits={"align": {"H100": 8}})
    result = plan_with([node_job("prod", "n000", tier=P)], [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert result.preemptions == ()
    assert result.pending_reasons["t1"].startswith("over team align quota for H100 (8/16 guaranteed, limit 8 reached")


def test_next_cycle_waits_for_the_stopping_victim_and_preempts_nobody_else():
    quotas = quota_tree({"align": {"H100": 8}}, limits={"align": {"H100": 8}})
    busy = [node_job("spot", "n000", terminating=True), node_job("other", "n001", team="x", start=5.0)]
    quotas = (*quotas, QuotaUnit("x", "root"))
    result = plan_with(busy, [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert result.preemptions == ()
    assert result.pending_reasons["t1"].startswith("waiting for stopping job(s) spot")


def test_tier_1_takes_its_own_teams_research_work_before_another_teams():
    quotas = quota_tree({"align": {"H100": 16}, "other": {"H100": 8}})
    # The other team's job has less work to lose, so by the plain order it would go first.
    busy = [
        node_job("own", "n000", tier=R, start=0.0),
        node_job("theirs", "n001", team="other", tier=R, start=NOW - 1000.0),
    ]
    jobs = [pending("t1", 1, 8, team="align", tier=P)]
    assert [p.job_id for p in plan_with(busy, jobs, quotas).preemptions] == ["own"]
    # A gang larger than a node frees victims in the common order (shared by every Tier 1 job of a plan):
    # there the other team's job, with less work to lose, goes.
    wide = cluster(nodes_per_leaf=4)
    busy = [
        running("own", [gpu_ids(wide, "n000"), gpu_ids(wide, "n001")], team="align", tier=R),
        running("theirs", [gpu_ids(wide, "n002"), gpu_ids(wide, "n003")], team="other", tier=R, start=NOW - 1000.0),
    ]
    quotas = quota_tree({"align": {"H100": 32}, "other": {"H100": 16}})
    result = plan(snapshot(wide, running=busy, pending=[pending("t1", 2, 8, team="align", tier=P)], quotas=quotas), now=NOW)
    assert [p.job_id for p in result.preemptions] == ["theirs"]


def test_tier_2_within_its_tiers_share_reclaims_its_own_teams_spot_work():
    quotas = quota_tree({"align": {"H100": 16}})
    busy = [node_job("research", "n000", tier=R), node_job("spot", "n001")]
    result = plan_with(busy, [pending("t2", 1, 8, team="align", tier=R)], quotas)
    assert [p.job_id for p in result.preemptions] == ["spot"]


def test_tier_1_work_is_never_a_victim_even_of_its_own_team():
    quotas = quota_tree({"align": {"H100": 24}})
    busy = [node_job("p1", "n000", tier=P), node_job("p2", "n001", tier=P)]
    result = plan_with(busy, [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert result.preemptions == ()


def test_without_preemption_the_limit_reason_stands():
    quotas = quota_tree({"align": {"H100": 8}}, limits={"align": {"H100": 8}})
    config = replace(Config(), preemption=False)
    result = plan_with([node_job("spot", "n000")], [pending("t1", 1, 8, team="align", tier=P)], quotas, config)
    assert result.preemptions == ()
    assert result.pending_reasons["t1"].startswith("over team align quota for H100")


def test_younger_than_min_runtime_spot_work_is_spared_and_the_reason_says_the_limit():
    quotas = quota_tree({"align": {"H100": 8}}, limits={"align": {"H100": 8}})
    young = node_job("spot", "n000", start=NOW - 10.0)
    result = plan_with([young], [pending("t1", 1, 8, team="align", tier=P)], quotas)
    assert result.preemptions == ()
    assert result.pending_reasons["t1"].startswith("over team align quota for H100")
