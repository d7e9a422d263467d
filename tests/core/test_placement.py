"""Placement: the lowest topology domain that holds the whole gang, best fit, GPU type respected."""

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, merge, node, pending, running, snapshot
from scheduling.core.types import Locality, Topology


def only_placement(snap):
    result = plan(snap, now=10_000.0)
    assert len(result.placements) == 1, result.pending_reasons
    return result.placements[0]


def test_eight_gpu_job_takes_a_whole_hgx_node_in_one_nvlink_domain():
    topo = cluster(nodes_per_leaf=2)
    p = only_placement(snapshot(topo, pending=[pending("j", 1, 8)]))
    assert p.locality == Locality.NVLINK
    assert set(p.replicas[0]) == set(gpu_ids(topo, p.nodes[0]))


def test_single_gpu_goes_to_the_node_with_fewest_free_gpus():
    topo = cluster(nodes_per_leaf=3)
    busy = [running("r1", [gpu_ids(topo, "n001", range(6))]), running("r2", [gpu_ids(topo, "n002", range(3))])]
    p = only_placement(snapshot(topo, running=busy, pending=[pending("j", 1, 1)]))
    assert p.nodes == ("n001",)


def test_four_gpu_job_stays_on_one_pcie_switch():
    topo = cluster(nodes_per_leaf=1)
    busy = [running("r1", [gpu_ids(topo, "n000", [0])])]
    p = only_placement(snapshot(topo, running=busy, pending=[pending("j", 1, 4)]))
    assert p.replicas[0] == gpu_ids(topo, "n000", [4, 5, 6, 7])


def test_two_gpu_job_takes_the_fuller_pcie_switch():
    topo = cluster(nodes_per_leaf=1)
    busy = [running("r1", [gpu_ids(topo, "n000", [4, 5])])]
    p = only_placement(snapshot(topo, running=busy, pending=[pending("j", 1, 2)]))
    assert p.replicas[0] == gpu_ids(topo, "n000", [6, 7])


def test_pcie_locality_on_nodes_without_a_shared_nvlink_domain():
    topo = Topology(nodes=(node("p0", nvlink_domains=4, pcie_switches=2),))
    p = only_placement(snapshot(topo, pending=[pending("j", 1, 4)]))
    assert p.locality == Locality.PCIE


def test_nvlink_domain_preferred_over_a_fuller_node_that_would_split_it():
    topo = Topology(nodes=(node("a", nvlink_domains=2), node("b", nvlink_domains=2)))
    # a: each NVLink domain has 2 free (4 free, but no 4 in one domain); b: one whole domain free.
    busy = [
        running("r1", [gpu_ids(topo, "a", [0, 1, 4, 5])]),
        running("r2", [gpu_ids(topo, "b", [0, 1, 2])]),
    ]
    p = only_placement(snapshot(topo, running=busy, pending=[pending("j", 1, 4)]))
    assert p.nodes == ("b",)
    assert p.locality == Locality.NVLINK


def test_multi_node_gang_takes_whole_nodes_in_one_leaf():
    topo = cluster(nodes_per_leaf=4, leaves_per_spine=2)
    busy = [running("r1", [gpu_ids(topo, "n000", [0])])]
    p = only_placement(snapshot(topo, running=busy, pending=[pending("j", 4, 8)]))
    assert p.locality == Locality.LEAF
    assert (p.leaves, p.spines) == (1, 1)
    assert set(p.nodes) == {"n004", "n005", "n006", "n007"}


def test_gang_prefers_the_leaf_left_with_fewest_free_gpus():
    topo = cluster(nodes_per_leaf=4, leaves_per_spine=2)
    # leaf-0 has 3 whole nodes free; leaf-1 has 4: a 2-node gang goes to leaf-0 and keeps leaf-1 whole.
    busy = [running("r1", [gpu_ids(topo, "n000")])]
    p = only_placement(snapshot(topo, running=busy, pending=[pending("j", 2, 8)]))
    assert {n[:4] for n in p.nodes} <= {"n001", "n002", "n003"}


def test_gang_too_big_for_a_leaf_spans_the_fewest_leaves_under_one_spine():
    topo = cluster(nodes_per_leaf=2, leaves_per_spine=3, spines=2)
    p = only_placement(snapshot(topo, pending=[pending("j", 4, 8)]))
    assert p.locality == Locality.SPINE
    assert (p.leaves, p.spines) == (2, 1)


def test_gang_too_big_for_a_spine_spans_the_fewest_spines():
    topo = cluster(nodes_per_leaf=2, leaves_per_spine=2, spines=3)
    p = only_placement(snapshot(topo, pending=[pending("j", 6, 8)]))
    assert p.locality == Locality.CLUSTER
    assert p.spines == 2


def test_replicas_never_split_across_nodes():
    topo = cluster(nodes_per_leaf=3)
    # 6 free GPUs on each node: a 3 x 4 gang needs three nodes, one replica on each.
    busy = [running(f"r{i}", [gpu_ids(topo, f"n00{i}", [0, 1])]) for i in range(3)]
    p = only_placement(snapshot(topo, running=busy, pending=[pending("j", 3, 4)]))
    for replica, node_name in zip(p.replicas, p.nodes, strict=True):
        assert {g.split("/")[0] for g in replica} == {node_name}
    assert len(set(p.nodes)) == 3


def test_small_gang_shares_one_node_when_it_fits():
    topo = cluster(nodes_per_leaf=2)
    p = only_placement(snapshot(topo, pending=[pending("j", 4, 2)]))
    assert len(set(p.nodes)) == 1
    assert p.locality == Locality.NVLINK


def test_gpu_type_is_respected():
    topo = merge(cluster(nodes_per_leaf=2, prefix="h"), cluster(nodes_per_leaf=2, gpu_type="A100", prefix="a"))
    p = only_placement(snapshot(topo, pending=[pending("j", 2, 8, gpu_type="A100")]))
    assert all(n.startswith("a") for n in p.nodes)


def test_node_that_is_not_ready_gets_no_placement():
    topo = Topology(nodes=(node("down", schedulable=False), node("up")))
    p = only_placement(snapshot(topo, pending=[pending("j", 1, 8)]))
    assert p.nodes == ("up",)


def test_gang_is_placed_whole_or_not_at_all():
    topo = cluster(nodes_per_leaf=3)
    busy = [running("r1", [gpu_ids(topo, "n000", [0])]), running("r2", [gpu_ids(topo, "n001", [0])])]
    result = plan(snapshot(topo, running=busy, pending=[pending("j", 2, 8)]), now=0.0)
    assert result.placements == ()
    assert "needs 2 whole nodes of 8 H100 under one leaf switch; best leaf has 1 free" in result.pending_reasons["j"]
