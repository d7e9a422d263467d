"""Properties of plan() over random clusters, quota trees and job mixes."""

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, pending, snapshot
from scheduling.core.types import Locality
from tests.property.invariants import check_plan
from tests.property.strategies import NOW, snapshots

FAST = settings(max_examples=80, deadline=None)


@FAST
@given(snapshots())
def test_every_plan_keeps_the_invariants(snap):
    check_plan(snap, plan(snap, now=NOW), NOW)


@FAST
@given(snapshots())
def test_plan_is_deterministic(snap):
    assert plan(snap, now=NOW) == plan(snap, now=NOW)


@FAST
@given(
    nodes_per_leaf=st.integers(1, 6),
    leaves=st.integers(1, 4),
    spines=st.integers(1, 2),
    data=st.data(),
)
def test_gang_that_fits_one_leaf_of_an_empty_cluster_is_placed_in_one_leaf(nodes_per_leaf, leaves, spines, data):
    topo = cluster(nodes_per_leaf=nodes_per_leaf, leaves_per_spine=leaves, spines=spines)
    per = data.draw(st.sampled_from([1, 2, 4, 8]))
    replicas = data.draw(st.integers(1, nodes_per_leaf * (8 // per)))
    result = plan(snapshot(topo, pending=[pending("j", replicas, per)]), now=0.0)
    (p,) = result.placements
    assert p.leaves == 1
    assert p.locality <= Locality.LEAF
