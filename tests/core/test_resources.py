"""CPU cores and memory beside GPUs: a replica fits a node only where all three are free."""

from dataclasses import replace

from scheduling.core.admission import admit
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, running, snapshot
from scheduling.core.types import Tier

GIB = 1024
NOW = 10_000.0


def test_sixteen_one_gpu_jobs_asking_sixteen_cores_fill_a_112_core_node_seven_times():
    # The case: before, all sixteen were "placed" on one 8-GPU, 112-core node (and its neighbour).
    topo = cluster(nodes_per_leaf=1, cpus=112, memory_mb=2048 * GIB)
    jobs = [pending(f"{i:02d}", 1, 1, cpus=16, memory_mb=16 * GIB) for i in range(16)]
    result = plan(snapshot(topo, pending=jobs), now=NOW)
    assert len(result.placements) == 7  # 7 x 16 = 112 cores; an eighth GPU stays free
    waiting = {j.job_id for j in jobs} - {p.job_id for p in result.placements}
    assert len(waiting) == 9
    assert result.pending_reasons[min(waiting)].startswith(
        "node n000 has 1 free H100 but 0 of 112 cores free; the job asks 16 per replica"
    )


def test_memory_binds_like_cores_and_the_reason_says_how_much():
    topo = cluster(nodes_per_leaf=1, cpus=112, memory_mb=256 * GIB)
    jobs = [pending("1", 1, 2, memory_mb=200 * GIB), pending("2", 1, 2, memory_mb=100 * GIB)]
    result = plan(snapshot(topo, pending=jobs), now=NOW)
    assert [p.job_id for p in result.placements] == ["1"]
    assert result.pending_reasons["2"].startswith(
        "node n000 has 6 free H100 but 56 GiB of 256 GiB memory free; the job asks 100 GiB per replica"
    )


def test_jobs_asking_their_gpus_share_place_exactly_as_gpu_only_jobs():
    # GPU-only behaviour for the defaults: 14 cores and 256 GiB per GPU of a 112-core, 2 TiB, 8-GPU node.
    topo = cluster(nodes_per_leaf=3, leaves_per_spine=2, cpus=112, memory_mb=2048 * GIB)
    plain = cluster(nodes_per_leaf=3, leaves_per_spine=2)
    shapes = [(1, 1), (1, 2), (2, 8), (1, 4), (3, 4), (1, 8), (4, 2), (1, 1), (2, 1), (1, 3), (5, 8)]
    busy = [running("r", [gpu_ids(topo, "n001", range(3))], cpus=3 * 14, memory_mb=3 * 256 * GIB)]
    sized = [pending(f"{i}", r, g, cpus=14 * g, memory_mb=256 * GIB * g) for i, (r, g) in enumerate(shapes)]
    bare = [replace(j, cpus_per_replica=0, memory_mb_per_replica=0) for j in sized]
    with_resources = plan(snapshot(topo, running=busy, pending=sized), now=NOW)
    gpus_only = plan(
        snapshot(plain, running=[replace(busy[0], cpus_per_replica=0, memory_mb_per_replica=0)], pending=bare), now=NOW
    )
    assert with_resources.placements == gpus_only.placements
    assert with_resources.pending_reasons == gpus_only.pending_reasons


def test_a_gang_heavy_on_cores_spreads_one_replica_per_node():
    topo = cluster(nodes_per_leaf=2, cpus=112)
    p = plan(snapshot(topo, pending=[pending("j", 2, 4, cpus=64)]), now=NOW).placements[0]
    assert sorted(p.nodes) == ["n000", "n001"]  # 2 x 64 cores would not fit one node's 112


def test_one_skewed_node_is_passed_over_for_a_node_with_the_cores():
    # n000 has the fewest free GPUs (best fit by GPUs) but a running job took most of its cores.
    topo = cluster(nodes_per_leaf=2, cpus=112)
    hog = running("hog", [gpu_ids(topo, "n000", [0, 1])], cpus=100)
    result = plan(snapshot(topo, running=[hog], pending=[pending("j", 1, 2, cpus=16)]), now=NOW)
    assert result.placements[0].nodes == ("n001",)
    # Without the hog's cores the same job would have gone to the fuller n000.
    light = replace(hog, cpus_per_replica=8)
    assert plan(snapshot(topo, running=[light], pending=[pending("j", 1, 2, cpus=16)]), now=NOW).placements[0].nodes == ("n000",)


def test_a_job_waiting_for_cores_reserves_them_and_starts_when_the_holder_ends():
    topo = cluster(nodes_per_leaf=1, cpus=112)
    hog = running("hog", [gpu_ids(topo, "n000", [0])], cpus=100, start=NOW - 100, time_limit=1_100.0)
    result = plan(snapshot(topo, running=[hog], pending=[pending("j", 1, 4, cpus=64)]), now=NOW)
    assert not result.placements
    assert result.estimated_start["j"] == NOW + 1_000.0  # the hog's end gives its cores back
    assert "0 of" not in result.pending_reasons["j"] and "12 of 112 cores free" in result.pending_reasons["j"]


def test_a_reclaim_counts_the_victims_cores():
    # A spot job holds 2 GPUs but 100 cores: the Tier 1 job's 6 free GPUs are not enough without them.
    topo = cluster(nodes_per_leaf=1, cpus=112)
    spot = running("spot", [gpu_ids(topo, "n000", [0, 1])], team="other", tier=Tier.SPOT, cpus=100, start=0.0)
    prod = pending("prod", 1, 4, team="mine", tier=Tier.PRODUCTION, cpus=48)
    from scheduling.core.testing import quota_tree

    quotas = quota_tree({"mine": {"H100": 8}, "other": {}})
    result = plan(snapshot(topo, running=[spot], pending=[prod], quotas=quotas), now=NOW)
    assert [v.job_id for v in result.preemptions] == ["spot"]


def test_admission_refuses_a_replica_no_node_could_give_its_cores_or_memory():
    topo = cluster(nodes_per_leaf=2, cpus=112, memory_mb=2048 * GIB)

    def check(job):
        return admit(snapshot(topo, pending=[job]), job, now=0.0)

    cores = check(pending("j", 1, 8, cpus=200))
    assert not cores.ok
    assert cores.reason.startswith("a replica asks 200 CPU cores, but the largest H100 node gives jobs 112")
    memory = check(pending("j", 1, 8, memory_mb=3 * 1024 * GIB))
    assert not memory.ok and "3 TiB of memory" in memory.reason and "2 TiB" in memory.reason
    by_cores = check(pending("j", 3, 1, cpus=100))
    assert not by_cores.ok and "hold at most 2" in by_cores.reason
    assert check(pending("j", 2, 1, cpus=100)).ok


def test_nodes_that_do_not_say_their_cores_never_limit():
    topo = cluster(nodes_per_leaf=1)  # cpus 0: not known
    result = plan(snapshot(topo, pending=[pending(f"{i}", 1, 1, cpus=500) for i in range(8)]), now=NOW)
    assert len(result.placements) == 8


def test_fair_share_counts_cores_in_the_dominant_share_only_where_they_dominate():
    # One GPU left; team "cores" used few GPUs but most of the cluster's cores, team "gpus" more GPUs at
    # its GPUs' share of cores. DRF: the cores are "cores"'s dominant share, so "gpus" goes first.
    from scheduling.core.testing import quota_tree

    topo = cluster(nodes_per_leaf=2, cpus=112)  # 16 GPUs, 224 cores
    busy = [running("r", [gpu_ids(topo, "n000"), gpu_ids(topo, "n001", range(7))], team="x")]
    jobs = [pending("1", 1, 1, team="cores"), pending("2", 1, 1, team="gpus")]
    usage = {"cores": {"H100": 2.0, "cpu": 200.0}, "gpus": {"H100": 8.0, "cpu": 64.0}}
    quotas = quota_tree({"cores": {}, "gpus": {}, "x": {"H100": 16}}, usage=usage)
    first = plan(snapshot(topo, running=busy, pending=jobs, quotas=quotas), now=NOW).placements[0].job_id
    assert first == "2"
    # Where the nodes do not say their cores, GPUs alone decide: "cores" used fewer GPUs and goes first.
    bare = cluster(nodes_per_leaf=2)
    assert plan(snapshot(bare, running=busy, pending=jobs, quotas=quotas), now=NOW).placements[0].job_id == "1"


def test_the_bucket_search_past_short_nodes_picks_what_the_scan_over_nodes_with_room_picks():
    # _single_node_buckets (the fast one) against _single_node_res (a scan of every node with room), on
    # random clusters where running work holds random cores: the same fit, or both none.
    import random

    from scheduling.core.free_state import FreeState
    from scheduling.core.index import carried, topo_index
    from scheduling.core.placement import _room
    from scheduling.core.placement_node import _single_node_buckets, _single_node_res

    rng = random.Random(7)
    for _ in range(60):
        topo = cluster(nodes_per_leaf=rng.randint(1, 6), leaves_per_spine=2, nvlink_domains=rng.choice([1, 2]), cpus=64)
        ix = topo_index(topo)
        busy, held = [], {}
        for n in topo.nodes:
            taken = rng.sample(range(8), rng.randint(0, 7))
            if taken:
                ids = [f"{n.name}/{i}" for i in taken]
                busy += [ix.gpu_loc[g] for g in ids]
                carried(held, ix.gpu_loc, [ids], rng.choice([0, 8, 30, 60]), 0)
        st = FreeState(ix, busy, held)
        for _ in range(8):
            replicas, per, cpus = rng.choice([1, 1, 2]), rng.choice([1, 2, 4]), rng.choice([1, 8, 20, 40])
            roomy = {ni for ni, k in _room(st, "H100", per, cpus, 0).items() if k >= replicas}
            fast = _single_node_buckets(st, "H100", replicas, per, 8, cpus, 0)
            assert fast == _single_node_res(st, "H100", replicas, per, roomy)
