"""Node capabilities (``Node.capabilities``, ``PendingJob.needs``): a job that runs in an image needs nodes
that run containers, and is placed only there -- on free GPUs, across nodes, by preemption, in a
reservation -- while a host job goes anywhere; the pending reason says how many nodes have a runtime."""

from dataclasses import replace

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import CONTAINERS, Tier, Topology

NOW = 100_000.0
NEEDS = frozenset({CONTAINERS})


def with_runtime(topology: Topology, *names: str) -> Topology:
    """The topology with a container runtime on the named nodes only."""
    return Topology(
        nodes=tuple(replace(n, capabilities=frozenset({CONTAINERS})) if n.name in names else n for n in topology.nodes)
    )


def in_image(job_id: str, replicas: int = 1, gpus: int = 8, **kw):
    return replace(pending(job_id, replicas, gpus, **kw), needs=NEEDS)


TOPO = with_runtime(cluster(nodes_per_leaf=4), "n002", "n003")  # n000..n003 of 8 H100; runc on n002, n003 only


def test_an_image_job_goes_to_a_node_with_a_runtime_where_best_fit_would_pick_another():
    busy = [running("r", [gpu_ids(TOPO, "n000", range(4))])]  # best fit for 4 GPUs: n000's other 4
    host = plan(snapshot(TOPO, running=busy, pending=[pending("host", 1, 4)]), now=NOW).placements[0]
    assert host.nodes == ("n000",)
    (p,) = plan(snapshot(TOPO, running=busy, pending=[in_image("img", 1, 4)]), now=NOW).placements
    assert p.nodes[0] in ("n002", "n003")


def test_a_multi_node_image_gang_takes_only_nodes_with_a_runtime():
    (p,) = plan(snapshot(TOPO, pending=[in_image("img", 2, 8)]), now=NOW).placements
    assert sorted(p.nodes) == ["n002", "n003"]


def test_an_image_gang_larger_than_the_nodes_with_a_runtime_waits_saying_how_many_have_one():
    result = plan(snapshot(TOPO, pending=[in_image("img", 3, 8)]), now=NOW)
    assert result.placements == ()
    reason = result.pending_reasons["img"]
    assert reason.startswith("needs nodes that run containers: 2 of 4 H100 nodes have a runtime; "), reason
    # the same gang as a host job fits on the four nodes
    assert plan(snapshot(TOPO, pending=[pending("host", 3, 8)]), now=NOW).placements


def test_with_no_node_that_runs_containers_the_reason_says_so_alone():
    bare = cluster(nodes_per_leaf=2)
    result = plan(snapshot(bare, pending=[in_image("img", 1, 1)]), now=NOW)
    assert result.placements == ()
    assert result.pending_reasons["img"] == "needs nodes that run containers: 0 of 2 H100 nodes have a runtime"


def test_a_failed_image_job_does_not_stop_a_host_job_of_the_same_shape():
    # Searches that fail are cached by shape: the image job's failure must not be taken for the host job's.
    busy = [running("r2", [gpu_ids(TOPO, "n002")]), running("r3", [gpu_ids(TOPO, "n003")])]
    result = plan(snapshot(TOPO, running=busy, pending=[in_image("img", 1, 8), pending("host", 1, 8)]), now=NOW)
    assert [p.job_id for p in result.placements] == ["host"]
    assert result.placements[0].nodes[0] in ("n000", "n001")
    assert "img" in result.pending_reasons


def test_preemption_for_an_image_job_takes_victims_only_on_nodes_with_a_runtime():
    quotas = quota_tree({"owner": {"H100": 8}, "borrower": {"H100": 0}})
    # The newest borrower (the first victim otherwise) is on n000, which has no runtime.
    busy = [running(f"b{i}", [gpu_ids(TOPO, f"n00{i}")], team="borrower", start=float(10 - i)) for i in range(4)]
    job = in_image("prod", 1, 8, team="owner", tier=Tier.PRODUCTION)
    result = plan(snapshot(TOPO, running=busy, pending=[job], quotas=quotas), now=NOW)
    assert [p.job_id for p in result.preemptions] in (["b2"], ["b3"])


def test_every_node_with_a_runtime_places_an_image_job_as_a_host_job():
    everywhere = with_runtime(cluster(nodes_per_leaf=4), "n000", "n001", "n002", "n003")
    busy = [running("r", [gpu_ids(everywhere, "n001", range(6))])]
    image = plan(snapshot(everywhere, running=busy, pending=[in_image("j", 1, 2)]), now=NOW).placements[0]
    host = plan(snapshot(everywhere, running=busy, pending=[pending("j", 1, 2)]), now=NOW).placements[0]
    assert image.replicas == host.replicas
