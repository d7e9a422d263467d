"""Leaf locality, required: a multi-node gang that one leaf switch could hold never spans leaves; it waits for one.

(The cost-based default, ``auto``, is tested in test_locality_cost.py.)"""

from dataclasses import replace

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, node, quota_tree, running, snapshot
from scheduling.core.testing import pending as any_pending
from scheduling.core.types import Config, LeafLocality, Locality, PendingJob, Tier, Topology

# Two leaves of four 8-GPU nodes: leaf-0 = n000..n003, leaf-1 = n004..n007.
TOPO = cluster(nodes_per_leaf=4, leaves_per_spine=2)


def pending(job_id: str, replicas: int = 1, gpus_per_replica: int = 8, **kw: object) -> PendingJob:
    return replace(any_pending(job_id, replicas, gpus_per_replica, **kw), locality=LeafLocality.REQUIRED)  # type: ignore[arg-type]


def one_node_busy_per_leaf(leaf0_ends=3600.0, leaf1_ends=7200.0):
    """Three whole nodes free in each leaf: six in all, but no leaf with four."""
    return [
        running("r0", [gpu_ids(TOPO, "n000")], time_limit=leaf0_ends),
        running("r1", [gpu_ids(TOPO, "n004")], time_limit=leaf1_ends),
    ]


def test_gang_that_fits_one_leaf_waits_rather_than_span_leaves():
    result = plan(snapshot(TOPO, running=one_node_busy_per_leaf(), pending=[pending("g", 4, 8)]), now=0.0)
    assert result.placements == ()


def test_waiting_gang_is_told_it_needs_one_leaf_and_where_it_is_reserved():
    result = plan(snapshot(TOPO, running=one_node_busy_per_leaf(), pending=[pending("g", 4, 8)]), now=0.0)
    assert result.pending_reasons["g"] == (
        "needs 4 whole nodes of 8 H100 under one leaf switch; best leaf has 3 free; reserved leaf-0, earliest in ~60 min"
        "; one leaf switch: required by the job"
    )


def test_reservation_goes_to_the_leaf_where_the_gang_fits_earliest():
    busy = one_node_busy_per_leaf(leaf0_ends=7200.0, leaf1_ends=1800.0)
    result = plan(snapshot(TOPO, running=busy, pending=[pending("g", 4, 8)]), now=0.0)
    (res,) = result.reservations
    assert (res.domain, res.earliest_start) == ("leaf-1", 1800.0)
    assert {g.split("/")[0] for g in res.gpus} == {"n004", "n005", "n006", "n007"}


def test_backfill_keeps_long_jobs_off_the_leaf_reserved_for_the_gang():
    jobs = [pending("g", 4, 8, submit_time=0.0), pending("long", 1, 8, submit_time=1.0, time_limit=36_000.0)]
    result = plan(snapshot(TOPO, running=one_node_busy_per_leaf(), pending=jobs), now=0.0)
    (p,) = result.placements
    assert p.job_id == "long"
    assert p.nodes[0] in {"n005", "n006", "n007"}


def test_gang_spans_leaves_once_it_has_waited_leaf_wait_s():
    snap = snapshot(TOPO, running=one_node_busy_per_leaf(), pending=[pending("g", 4, 8)], config=Config(leaf_wait_s=600.0))
    (p,) = plan(snap, now=600.0).placements
    assert (p.locality, p.leaves) == (Locality.SPINE, 2)


def test_gang_within_its_leaf_wait_still_waits():
    snap = snapshot(TOPO, running=one_node_busy_per_leaf(), pending=[pending("g", 4, 8)], config=Config(leaf_wait_s=600.0))
    assert plan(snap, now=599.0).placements == ()


def test_gang_larger_than_any_leaf_still_spans_the_fewest_leaves():
    (p,) = plan(snapshot(TOPO, running=one_node_busy_per_leaf(), pending=[pending("g", 5, 8)]), now=0.0).placements
    assert (p.locality, p.leaves, p.spines) == (Locality.SPINE, 2, 1)


def test_a_leaf_counts_only_its_ready_nodes():
    # Each leaf has four nodes but only three READY: no leaf could ever hold four, so the gang spans.
    topo = Topology(
        nodes=tuple(
            node(f"n{i}", leaf=f"leaf-{i // 4}", schedulable=i % 4 != 0)  # n0 and n4 are down
            for i in range(8)
        )
    )
    (p,) = plan(snapshot(topo, pending=[pending("g", 4, 8)]), now=0.0).placements
    assert p.leaves == 2


def test_partial_node_replicas_count_whole_replicas_per_leaf():
    # 4 x 4 GPUs: leaf-0 holds 3 replicas (n000 half busy), leaf-1 holds 3 too; it waits for one leaf.
    busy = [
        running("a", [gpu_ids(TOPO, "n000", range(4)), *[gpu_ids(TOPO, f"n00{i}") for i in (1, 2)]]),
        running("b", [gpu_ids(TOPO, "n004", range(4)), *[gpu_ids(TOPO, f"n00{i}") for i in (5, 6)]]),
    ]
    result = plan(snapshot(TOPO, running=busy, pending=[pending("g", 4, 4)]), now=0.0)
    assert result.placements == ()
    assert (
        "needs 4 replicas of 4 H100 under one leaf switch (each on one node); best leaf holds 3" in (result.pending_reasons["g"])
    )


def test_reclaim_frees_room_in_one_leaf_instead_of_spanning_two():
    # One free node per leaf; a spot job on the other node of each. Two free nodes would hold the
    # gang across leaves; under one leaf it needs one victim, the one that lost least work.
    topo = cluster(nodes_per_leaf=2, leaves_per_spine=2)
    busy = [
        running("s-old", [gpu_ids(topo, "n001")], team="borrower", tier=Tier.SPOT, start=0.0),
        running("s-new", [gpu_ids(topo, "n003")], team="borrower", tier=Tier.SPOT, start=50_000.0),
    ]
    quotas = quota_tree({"owner": {"H100": 16}, "borrower": {}})
    snap = snapshot(topo, running=busy, pending=[pending("g", 2, 8, team="owner")], quotas=quotas)
    result = plan(snap, now=100_000.0)
    assert result.placements == ()
    assert [p.job_id for p in result.preemptions] == ["s-new"]
    (res,) = result.reservations
    assert res.domain == "leaf-1"
