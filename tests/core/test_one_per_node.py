"""One replica per node (``PendingJob.one_per_node``, Slurm's --nodes=N): a gang's replicas on N distinct
nodes, never two on one -- when placed on free GPUs, when freed by preemption, and refused at
admission where the cluster has fewer nodes than replicas."""

from dataclasses import replace

from scheduling.core.admission import admit
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import Tier

TOPO = cluster(nodes_per_leaf=4)  # n000..n003: 4 nodes of 8 H100 under one leaf
NOW = 100_000.0


def spread(job_id: str, replicas: int, gpus: int, **kw):
    return replace(pending(job_id, replicas, gpus, **kw), one_per_node=True)


def test_four_one_gpu_replicas_take_four_distinct_nodes_where_one_node_would_hold_them():
    packed = plan(snapshot(TOPO, pending=[pending("packed", 4, 1)]), now=NOW).placements[0]
    assert len(set(packed.nodes)) == 1  # without the rule the gang shares one node (best fit)
    (p,) = plan(snapshot(TOPO, pending=[spread("slurm", 4, 1)]), now=NOW).placements
    assert sorted(p.nodes) == ["n000", "n001", "n002", "n003"]
    for replica, node_name in zip(p.replicas, p.nodes, strict=True):
        assert len(replica) == 1 and replica[0].split("/")[0] == node_name


def test_a_spread_gang_waits_while_one_of_the_nodes_it_needs_is_full():
    busy = [running("full", [gpu_ids(TOPO, "n002")])]
    result = plan(snapshot(TOPO, running=busy, pending=[spread("slurm", 4, 2)]), now=NOW)
    assert result.placements == () and "slurm" in result.pending_reasons
    # the same gang without the rule fits on the other three nodes' 24 free GPUs
    assert plan(snapshot(TOPO, running=busy, pending=[pending("packed", 4, 2)]), now=NOW).placements


def test_preemption_for_a_spread_gang_frees_a_gpu_on_each_of_its_nodes():
    quotas = quota_tree({"owner": {"H100": 32}, "borrower": {"H100": 0}})
    busy = [running(f"b{i}", [gpu_ids(TOPO, f"n00{i}")], team="borrower", start=float(i)) for i in range(4)]
    job = spread("prod", 4, 1, team="owner", tier=Tier.PRODUCTION)
    result = plan(snapshot(TOPO, running=busy, pending=[job], quotas=quotas), now=NOW)
    assert sorted(p.job_id for p in result.preemptions) == ["b0", "b1", "b2", "b3"]
    (reservation,) = result.reservations
    assert sorted({g.split("/")[0] for g in reservation.gpus}) == ["n000", "n001", "n002", "n003"]
    packed = plan(snapshot(TOPO, running=busy, pending=[replace(job, one_per_node=False)], quotas=quotas), now=NOW)
    assert len(packed.preemptions) == 1  # one node's GPUs would do without the rule


def test_more_replicas_than_nodes_can_never_run():
    quotas = quota_tree({"team-a": {"H100": 32}})
    verdict = admit(snapshot(TOPO, quotas=quotas), spread("slurm", 5, 1), now=0.0)
    assert not verdict.ok
    assert verdict.reason == "needs 5 nodes with 1 H100 each (one replica per node); the cluster has 4"
    assert admit(snapshot(TOPO, quotas=quotas), pending("packed", 5, 1), now=0.0).ok
