"""Trace reading, gang shapes, time limits and quota scaling."""

from __future__ import annotations

from pathlib import Path

from scheduling.sim.cluster import ClusterShape, build_topology, scale_guarantees
from scheduling.sim.trace import gang_shape, load_trace, time_limits

SAMPLE = Path(__file__).parent.parent / "data" / "philly_sep2017_sample2k.csv"


def test_sample_loads_in_submit_order() -> None:
    jobs = load_trace(SAMPLE)
    assert len(jobs) == 2000
    assert [(j.submit_time, j.job_id) for j in jobs] == sorted((j.submit_time, j.job_id) for j in jobs)


def test_gang_shape_splits_into_fewest_equal_replicas_that_fit_a_node() -> None:
    assert gang_shape(4, 8) == (1, 4)
    assert gang_shape(16, 8) == (2, 8)
    assert gang_shape(28, 8) == (4, 7)
    assert gang_shape(48, 8) == (6, 8)


def test_estimated_limit_is_a_round_value_never_below_duration() -> None:
    jobs = load_trace(SAMPLE)
    limits = time_limits(jobs, "estimate")
    assert all(limits[j.job_id] >= j.duration_s for j in jobs)
    assert all(limits[j.job_id] % 3600 == 0 for j in jobs if j.duration_s <= 90 * 86400)


def test_oracle_limit_is_the_true_duration() -> None:
    jobs = load_trace(SAMPLE, limit=100)
    limits = time_limits(jobs, "oracle")
    assert all(limits[j.job_id] == max(j.duration_s, 1.0) for j in jobs)


def test_guarantees_are_proportional_and_sum_to_the_cluster() -> None:
    g = scale_guarantees({"a": 64, "b": 32, "c": 16}, ["a", "b", "c", "d"], 1000)
    assert sum(g.values()) == 1000
    assert g["d"] == 0
    assert g["a"] == 571 and g["b"] == 286 and g["c"] == 143


def test_topology_has_leaves_of_the_given_size_in_name_order() -> None:
    topo = build_topology(ClusterShape(nodes=70, nodes_per_leaf=32, leaves_per_spine=2))
    leaves = [n.leaf for n in topo.nodes]
    assert leaves[:32] == ["leaf-0"] * 32 and leaves[64:] == ["leaf-2"] * 6
    assert topo.nodes[64].spine == "spine-1"
    assert [n.name for n in topo.nodes] == sorted(n.name for n in topo.nodes)
