"""plan() is a pure function of the snapshot: same input, same plan, whatever the tuple order."""

import gc
from dataclasses import replace

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, running, snapshot
from scheduling.core.types import Topology

TOPO = cluster(nodes_per_leaf=3, leaves_per_spine=2)


def sample():
    busy = [running("r1", [gpu_ids(TOPO, "n000", range(3))], time_limit=500.0), running("r2", [gpu_ids(TOPO, "n004")])]
    jobs = [pending(f"j{i}", 1 + i % 3, 4 if i % 2 else 8, submit_time=float(i % 4)) for i in range(12)]
    return snapshot(TOPO, running=busy, pending=jobs)


def test_same_snapshot_gives_the_same_plan():
    snap = sample()
    assert plan(snap, now=100.0) == plan(snap, now=100.0)


def test_order_of_the_snapshot_tuples_does_not_matter():
    snap = sample()
    shuffled = replace(
        snap,
        topology=Topology(nodes=tuple(reversed(snap.topology.nodes))),
        running=tuple(reversed(snap.running)),
        pending=tuple(reversed(snap.pending)),
        quotas=tuple(reversed(snap.quotas)),
    )
    assert plan(snap, now=100.0) == plan(shuffled, now=100.0)


def test_plan_pauses_the_cyclic_garbage_collector_and_restores_it():
    assert gc.isenabled()
    plan(sample(), now=100.0)
    assert gc.isenabled()  # back on: the process keeps collecting
    gc.disable()
    try:
        plan(sample(), now=100.0)
        assert not gc.isenabled()  # a caller that had it off keeps it off
    finally:
        gc.enable()
