"""Reclaim and preemption: the cheapest victims that free a topology-valid placement."""

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import Config, Tier

TOPO = cluster(nodes_per_leaf=2)  # n000, n001: 16 H100
NOW = 100_000.0
QUOTAS = quota_tree({"owner": {"H100": 8}, "borrower": {"H100": 0}})


def plan_with(busy, jobs, quotas=QUOTAS, config=None):
    return plan(snapshot(TOPO, running=busy, pending=jobs, quotas=quotas, config=config), now=NOW)


def full_of(tier=Tier.RESEARCH, team="borrower", start=0.0, **kw):
    return [
        running("x", [gpu_ids(TOPO, "n000")], team=team, tier=tier, start=start, **kw),
        running("y", [gpu_ids(TOPO, "n001")], team=team, tier=tier, start=start + 1, **kw),
    ]


def test_team_within_guarantee_reclaims_from_a_borrower():
    result = plan_with(full_of(), [pending("mine", 1, 8, team="owner")])
    assert [(p.job_id, p.for_job) for p in result.preemptions] == [("y", "mine")]
    assert result.preemptions[0].grace_s == Config().grace_period_s
    assert "reclaimed for job #mine" in result.preemptions[0].reason


def test_preemptor_gets_a_reservation_on_the_freed_gpus_not_a_placement():
    result = plan_with(full_of(), [pending("mine", 1, 8, team="owner")])
    assert result.placements == ()
    (res,) = result.reservations
    assert res.job_id == "mine"
    assert set(res.gpus) == set(gpu_ids(TOPO, "n001"))
    assert result.estimated_start["mine"] == NOW + Config().grace_period_s


def test_freed_gpus_are_not_given_to_anyone_else_in_the_same_plan():
    busy = [
        running("x", [gpu_ids(TOPO, "n000")], team="borrower"),
        running("y", [gpu_ids(TOPO, "n001", range(4))], team="borrower"),
    ]
    jobs = [pending("mine", 1, 8, team="owner"), pending("other", 1, 4, team="borrower", submit_time=5.0)]
    result = plan_with(busy, jobs)
    reserved = {g for r in result.reservations for g in r.gpus}
    placed = {g for p in result.placements for rep in p.replicas for g in rep}
    assert not reserved & placed


def test_job_over_its_guarantee_does_not_preempt():
    result = plan_with(full_of(), [pending("mine", 2, 8, team="owner")])
    assert result.preemptions == ()


def test_tier_3_is_preempted_before_a_borrowing_tier_2_job():
    busy = [
        running("t2", [gpu_ids(TOPO, "n000")], team="borrower", tier=Tier.RESEARCH, start=5000.0),
        running("t3", [gpu_ids(TOPO, "n001")], team="borrower", tier=Tier.SPOT, start=0.0),
    ]
    result = plan_with(busy, [pending("mine", 1, 8, team="owner")])
    assert [p.job_id for p in result.preemptions] == ["t3"]


def test_least_work_lost_since_checkpoint_is_preempted_first():
    busy = [
        running("fresh-ckpt", [gpu_ids(TOPO, "n000")], team="borrower", start=0.0, last_checkpoint=NOW - 60),
        running("old-ckpt", [gpu_ids(TOPO, "n001")], team="borrower", start=10.0, last_checkpoint=NOW - 6000),
    ]
    result = plan_with(busy, [pending("mine", 1, 8, team="owner")])
    assert [p.job_id for p in result.preemptions] == ["fresh-ckpt"]


def test_tier_1_is_never_preempted():
    result = plan_with(full_of(tier=Tier.PRODUCTION, team="borrower"), [pending("mine", 1, 8, team="owner")])
    assert result.preemptions == ()


def test_terminating_job_is_never_preempted_again_and_its_gpus_are_awaited():
    busy = full_of()
    busy[1] = running("y", [gpu_ids(TOPO, "n001")], team="borrower", start=1.0, terminating=True)
    result = plan_with(busy, [pending("mine", 1, 8, team="owner")])
    assert result.preemptions == ()
    assert set(result.reservations[0].gpus) == set(gpu_ids(TOPO, "n001"))


def test_job_younger_than_min_runtime_is_not_preempted():
    result = plan_with(full_of(start=NOW - 60), [pending("mine", 1, 8, team="owner")])
    assert result.preemptions == ()


def test_in_quota_tier_2_job_is_not_reclaimed_by_another_tier_2_team():
    quotas = quota_tree({"owner": {"H100": 8}, "holder": {"H100": 16}})
    result = plan_with(full_of(team="holder"), [pending("mine", 1, 8, team="owner")], quotas=quotas)
    assert result.preemptions == ()


def test_tier_1_may_preempt_in_quota_tier_2_as_a_last_resort():
    quotas = quota_tree({"prod": {"H100": 8}, "holder": {"H100": 16}})
    busy = full_of(team="holder")
    result = plan_with(busy, [pending("p", 1, 8, team="prod", tier=Tier.PRODUCTION)], quotas=quotas)
    assert len(result.preemptions) == 1
    assert "Tier 1" in result.preemptions[0].reason


def test_victims_make_room_in_one_node_not_scattered_over_the_cluster():
    # Four 4-GPU spot jobs, two per node; the cheapest two by work lost sit on different nodes.
    busy = [
        running("a", [gpu_ids(TOPO, "n000", range(4))], team="borrower", tier=Tier.SPOT, start=NOW - 700),
        running("b", [gpu_ids(TOPO, "n000", range(4, 8))], team="borrower", tier=Tier.SPOT, start=0.0),
        running("c", [gpu_ids(TOPO, "n001", range(4))], team="borrower", tier=Tier.SPOT, start=NOW - 800),
        running("d", [gpu_ids(TOPO, "n001", range(4, 8))], team="borrower", tier=Tier.SPOT, start=1.0),
    ]
    result = plan_with(busy, [pending("mine", 1, 8, team="owner")])
    victims = {p.job_id for p in result.preemptions}
    assert victims in ({"a", "b"}, {"c", "d"})


def test_one_victim_on_one_node_beats_two_on_another():
    busy = [
        running("a", [gpu_ids(TOPO, "n000", range(4))], team="borrower", tier=Tier.SPOT, start=NOW - 700),
        running("b", [gpu_ids(TOPO, "n000", range(4, 8))], team="borrower", tier=Tier.SPOT, start=NOW - 700),
        running("c", [gpu_ids(TOPO, "n001")], team="borrower", tier=Tier.SPOT, start=NOW - 5000),
    ]
    result = plan_with(busy, [pending("mine", 1, 8, team="owner")])
    assert [p.job_id for p in result.preemptions] == ["c"]


def test_multi_node_gang_frees_whole_nodes_in_one_leaf():
    topo = cluster(nodes_per_leaf=2, leaves_per_spine=2)
    busy = [running(f"s{i}", [gpu_ids(topo, f"n00{i}")], team="borrower", tier=Tier.SPOT) for i in range(4)]
    quotas = quota_tree({"owner": {"H100": 16}, "borrower": {}})
    result = plan(snapshot(topo, running=busy, pending=[pending("mine", 2, 8, team="owner")], quotas=quotas), now=NOW)
    assert len(result.preemptions) == 2
    (res,) = result.reservations
    assert res.domain.startswith("leaf-")


def test_preemption_can_be_switched_off():
    result = plan_with(full_of(), [pending("mine", 1, 8, team="owner")], config=Config(preemption=False))
    assert result.preemptions == ()


def test_at_most_max_reclaims_jobs_preempt_in_one_plan_and_the_rest_are_told_next_cycle():
    busy = full_of()
    jobs = [pending("first", 1, 8, team="owner"), pending("second", 1, 8, team="owner", submit_time=1.0)]
    quotas = quota_tree({"owner": {"H100": 16}, "borrower": {"H100": 0}})
    result = plan_with(busy, jobs, quotas=quotas, config=Config(max_reclaims=1))
    assert [(p.job_id, p.for_job) for p in result.preemptions] == [("y", "first")]
    assert result.pending_reasons["second"].endswith("; may preempt at the next cycle (at most 1 jobs preempt in one cycle)")
    assert len(plan_with(busy, jobs, quotas=quotas).preemptions) == 2  # the default leaves room for both
