"""The admission check: never-runnable jobs refused with a reason; others told where or how long."""

from scheduling.core.admission import admit
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import QuotaUnit, Tier

TOPO = cluster(nodes_per_leaf=2, leaves_per_spine=2)  # 4 nodes, 32 H100
QUOTAS = quota_tree({"vision": {"H100": 16}}, limits={"vision": {"H100": 24}})


def check(job, running_jobs=(), quotas=QUOTAS):
    return admit(snapshot(TOPO, running=running_jobs, quotas=quotas), job, now=0.0)


def test_more_gpus_than_the_cluster_has_is_refused():
    verdict = check(pending("j", 5, 8, team="vision"), quotas=quota_tree({"vision": {}}))
    assert not verdict.ok
    assert "whole cluster has 32" in verdict.reason


def test_replica_larger_than_a_node_is_refused():
    verdict = check(pending("j", 1, 16, team="vision"))
    assert not verdict.ok
    assert "largest H100 node has 8" in verdict.reason


def test_gpu_type_the_cluster_lacks_is_refused():
    assert not check(pending("j", 1, 1, team="vision", gpu_type="B200")).ok


def test_tier_1_beyond_guarantee_is_refused():
    verdict = check(pending("j", 3, 8, team="vision", tier=Tier.PRODUCTION))
    assert not verdict.ok
    assert "Tier 1 runs only within guarantee" in verdict.reason


def test_above_the_team_limit_is_refused():
    verdict = check(pending("j", 4, 8, team="vision"))
    assert not verdict.ok
    assert "limit of 24" in verdict.reason


def test_above_an_ancestor_limit_is_refused():
    quotas = [QuotaUnit("root", None), QuotaUnit("dept", "root", limit={"H100": 8}), QuotaUnit("vision", "dept")]
    verdict = check(pending("j", 2, 8, team="vision"), quotas=quotas)
    assert not verdict.ok
    assert "unit dept" in verdict.reason


def test_job_that_fits_now_is_told_where():
    verdict = check(pending("j", 1, 8, team="vision"))
    assert verdict.ok
    assert verdict.reason == "fits now on leaf-0 (node n000, NVLink domain intact)"


def test_job_that_must_wait_is_told_how_long():
    full = [running(f"r{i}", [gpu_ids(TOPO, f"n00{i}")], team="other", time_limit=2400.0) for i in range(4)]
    quotas = quota_tree({"vision": {"H100": 16}, "other": {"H100": 16}})
    verdict = check(pending("j", 1, 8, team="vision"), running_jobs=full, quotas=quotas)
    assert verdict.ok
    assert verdict.reason.startswith("waits ~40 min")


def test_job_queued_behind_another_reservation_is_told_so():
    full = [running(f"r{i}", [gpu_ids(TOPO, f"n00{i}")], team="other", time_limit=2400.0 * (i + 1)) for i in range(4)]
    quotas = quota_tree({"vision": {}, "other": {"H100": 16}})
    queued = pending("first", 1, 8, team="other", submit_time=-10.0)
    snap = snapshot(TOPO, running=full, pending=[queued], quotas=quotas)
    verdict = admit(snap, pending("j", 1, 8, team="vision", time_limit=99_999.0), now=0.0)
    assert verdict.ok
    assert "waiting behind a reservation for job #first" in verdict.reason
