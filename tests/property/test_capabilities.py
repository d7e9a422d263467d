"""Node capabilities over random snapshots: with a container runtime on some nodes and some jobs in an
image, every plan keeps the invariants, places an image job only on nodes with a runtime (by preemption
too), and stays deterministic."""

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.plan import plan
from scheduling.core.types import CONTAINERS, Snapshot, Topology
from tests.property.invariants import check_plan
from tests.property.strategies import NOW, snapshots

FAST = settings(max_examples=80, deadline=None)
NEEDS = frozenset({CONTAINERS})


@st.composite
def with_capabilities(draw: st.DrawFn) -> Snapshot:
    snap = draw(snapshots())
    nodes = tuple(
        replace(n, capabilities=NEEDS) if draw(st.booleans()) else n  # about half the nodes run containers
        for n in snap.topology.nodes
    )
    pending = tuple(replace(j, needs=NEEDS) if draw(st.booleans()) else j for j in snap.pending)
    return replace(snap, topology=Topology(nodes=nodes), pending=pending)


@FAST
@given(with_capabilities())
def test_image_jobs_go_only_to_nodes_with_a_runtime_and_plans_keep_the_invariants(snap):
    result = plan(snap, now=NOW)
    check_plan(snap, result, NOW)
    capable = {n.name for n in snap.topology.nodes if CONTAINERS in n.capabilities}
    needing = {j.job_id for j in snap.pending if j.needs}
    for placement in result.placements:
        if placement.job_id in needing:
            assert set(placement.nodes) <= capable, (placement.job_id, placement.nodes, sorted(capable))
    assert plan(snap, now=NOW) == result
