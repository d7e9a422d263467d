"""Estimated starts for every kind of wait (scheduling/core/eta.py), from the running jobs' time limits."""

from scheduling.core.eta import admit, start_estimates, with_estimates
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import QuotaUnit, Tier

TOPO = cluster(nodes_per_leaf=4)  # 4 nodes, 32 H100


def _estimates(snap, now=0.0):
    result = plan(snap, now=now)
    return result, start_estimates(snap, result, now=now)


def test_a_job_over_its_team_limit_starts_when_enough_of_the_teams_jobs_end():
    quotas = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 16}})
    busy = [
        running("early", [gpu_ids(TOPO, "n000")], team="vision", time_limit=3600),
        running("late", [gpu_ids(TOPO, "n001")], team="vision", time_limit=7200),
    ]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision")], quotas=quotas)
    result, estimates = _estimates(snap)
    assert result.pending_reasons["j"].startswith("over team vision quota")
    assert "j" not in result.estimated_start  # the core gives it none: this module does
    assert estimates["j"].start == 3600 and estimates["j"].after_job == "early"


def test_a_job_needing_more_than_one_end_waits_for_the_last_it_needs():
    quotas = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 16}})
    busy = [
        running("a", [gpu_ids(TOPO, "n000", range(4))], team="vision", time_limit=1000),
        running("b", [gpu_ids(TOPO, "n000", range(4, 8))], team="vision", time_limit=2000),
        running("c", [gpu_ids(TOPO, "n001")], team="vision", time_limit=9000),
    ]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision")], quotas=quotas)
    _, estimates = _estimates(snap)
    assert estimates["j"].start == 2000 and estimates["j"].after_job == "b"


def test_an_ancestors_limit_counts_every_team_below_it():
    quotas = [
        QuotaUnit("root", None),
        QuotaUnit("research", "root", limit={"H100": 16}),
        QuotaUnit("vision", "research", guaranteed={"H100": 8}),
        QuotaUnit("nlp", "research", guaranteed={"H100": 8}),
    ]
    busy = [
        running("v", [gpu_ids(TOPO, "n000")], team="vision", time_limit=500),
        running("n", [gpu_ids(TOPO, "n001")], team="nlp", time_limit=300),
    ]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision")], quotas=quotas)
    result, estimates = _estimates(snap)
    assert result.pending_reasons["j"].startswith("over parent unit research quota")
    assert estimates["j"].start == 300 and estimates["j"].after_job == "n"


def test_tier_1_beyond_its_guarantee_starts_when_the_team_is_back_within_it():
    quotas = quota_tree({"vision": {"H100": 8}})
    busy = [running("r1", [gpu_ids(TOPO, "n000")], team="vision", tier=Tier.PRODUCTION, time_limit=1800)]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision", tier=Tier.PRODUCTION)], quotas=quotas)
    _, estimates = _estimates(snap)
    assert estimates["j"].start == 1800


def test_a_capacity_wait_without_a_reservation_gets_the_moment_it_would_fit():
    # Two jobs that need the whole cluster: the first gets the one reservation, the second an estimate
    # after the first one's time limit (it holds every GPU from its start).
    busy = [running("r", [gpu_ids(TOPO, n) for n in ("n000", "n001", "n002", "n003")], time_limit=1000)]
    jobs = [pending("first", 4, 8, submit_time=0, time_limit=500), pending("second", 4, 8, submit_time=1, time_limit=500)]
    result, estimates = _estimates(snapshot(TOPO, running=busy, pending=jobs))
    assert result.estimated_start["first"] == 1000
    assert "second" not in result.estimated_start
    assert estimates["first"].start == 1000  # the reservation's own start, unchanged
    assert estimates["second"].start == 1500


def test_a_quota_wait_on_a_full_cluster_waits_for_both():
    quotas = quota_tree({"vision": {"H100": 8}, "nlp": {"H100": 24}}, limits={"vision": {"H100": 16}})
    busy = [
        running("v", [gpu_ids(TOPO, "n000")], team="vision", time_limit=100),
        running("n", [gpu_ids(TOPO, n) for n in ("n001", "n002", "n003")], team="nlp", time_limit=5000),
    ]
    # vision's quota has room at 100, when v ends; its 2-node job finds a second free node only at 5000.
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 2, 8, team="vision")], quotas=quotas)
    result, estimates = _estimates(snap)
    assert result.pending_reasons["j"].startswith("over team vision quota")
    assert estimates["j"].start == 5000 and estimates["j"].after_job == "n"


def test_a_job_that_can_never_run_gets_no_estimate():
    snap = snapshot(TOPO, pending=[pending("huge", 8, 8)])
    result, estimates = _estimates(snap)
    assert result.pending_reasons["huge"].startswith("can never run")
    assert "huge" not in estimates


def test_with_estimates_names_the_job_a_quota_wait_waits_for_and_keeps_the_rest():
    quotas = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 8}})
    busy = [running("812", [gpu_ids(TOPO, "n000")], team="vision", time_limit=600)]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision")], quotas=quotas)
    result = plan(snap, now=0.0)
    out = with_estimates(snap, result, now=0.0)
    assert out.estimated_start["j"] == 600
    assert out.pending_reasons["j"] == result.pending_reasons["j"] + "; frees up when job #812 ends"
    assert out.placements == result.placements and out.reservations == result.reservations


def test_the_preview_says_how_long_a_quota_wait_lasts():
    quotas = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 8}})
    busy = [running("812", [gpu_ids(TOPO, "n000")], team="vision", time_limit=7200)]
    snap = snapshot(TOPO, running=busy, quotas=quotas)
    verdict = admit(snap, pending("new", 1, 8, team="vision"), now=0.0)
    assert verdict.ok
    assert verdict.reason.startswith("waits ~2 h: over team vision quota for H100")
    assert verdict.reason.endswith("frees up when job #812 ends")


def test_the_preview_still_says_fits_now_and_never():
    snap = snapshot(TOPO, quotas=quota_tree({"vision": {"H100": 32}}))
    assert admit(snap, pending("a", 1, 8, team="vision"), now=0.0).reason.startswith("fits now")
    never = admit(snap, pending("b", 8, 8, team="vision"), now=0.0)
    assert not never.ok and "the whole cluster has 32" in never.reason


def test_estimates_are_the_same_for_the_same_input():
    quotas = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 16}})
    busy = [running(f"r{i}", [gpu_ids(TOPO, f"n00{i}")], team="vision", time_limit=100 * (i + 1)) for i in range(2)]
    jobs = [pending(f"p{i}", 1, 8, team="vision", submit_time=i) for i in range(3)]
    snap = snapshot(TOPO, running=busy, pending=jobs, quotas=quotas)
    first = _estimates(snap)[1]
    assert first == _estimates(snap)[1]
    assert all(e.start >= 0 for e in first.values())
