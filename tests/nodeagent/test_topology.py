"""Folding pairwise topology into domains, GPU type names, and the simulated node layouts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeagent.simgpu import SimulatedGpus, TopologyError, gpus_from_file, gpus_from_spec
from nodeagent.topology import fold_groups, gpu_type_from_name


def test_fold_groups_labels_connected_components_by_lowest_index() -> None:
    edges = [(("gpu", 3), ("gpu", 2)), (("gpu", 0), ("gpu", 1))]
    assert fold_groups(range(4), edges, "nvl") == {0: "nvl0", 1: "nvl0", 2: "nvl1", 3: "nvl1"}


def test_fold_groups_joins_gpus_through_a_shared_switch_vertex() -> None:
    edges = [(("gpu", i), ("nvswitch",)) for i in range(8)]
    assert set(fold_groups(range(8), edges, "nvl").values()) == {"nvl0"}


def test_fold_groups_gives_a_lone_gpu_its_own_group() -> None:
    assert fold_groups(range(3), [(("gpu", 0), ("gpu", 1))], "nvl") == {0: "nvl0", 1: "nvl0", 2: "nvl1"}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-32GB", "V100"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
    ],
)
def test_gpu_type_is_the_short_family_name(name: str, expected: str) -> None:
    assert gpu_type_from_name(name) == expected


def test_simulated_8xh100_is_one_nvlink_domain_over_two_pcie_switches_and_numa_nodes() -> None:
    gpus = gpus_from_spec("8xH100", node="n1")
    assert {g.nvlink_domain for g in gpus} == {"nvl0"}
    assert [g.pcie_switch for g in gpus] == ["pcie0"] * 4 + ["pcie1"] * 4
    assert [g.numa_node for g in gpus] == [0] * 4 + [1] * 4
    assert {g.gpu_type for g in gpus} == {"H100"} and gpus[0].memory_mb == 81559


def test_simulated_uuids_are_stable_per_node_and_distinct_across_nodes() -> None:
    assert gpus_from_spec("2xH100", node="a") == gpus_from_spec("2xH100", node="a")
    assert gpus_from_spec("1xH100", node="a")[0].uuid != gpus_from_spec("1xH100", node="b")[0].uuid


def test_bad_simulate_spec_is_refused_with_the_expected_form() -> None:
    with pytest.raises(TopologyError, match="8xH100"):
        gpus_from_spec("eight", node="n1")


def test_topology_file_gives_the_listed_gpus(tmp_path: Path) -> None:
    path = tmp_path / "topo.json"
    path.write_text(
        json.dumps(
            {
                "gpus": [
                    {
                        "index": 0,
                        "name": "NVIDIA H200",
                        "memory_mb": 143771,
                        "nvlink_domain": "nvl0",
                        "pcie_switch": "pcie0",
                        "numa_node": 0,
                    },
                    {
                        "index": 1,
                        "name": "NVIDIA H200",
                        "memory_mb": 143771,
                        "nvlink_domain": "nvl1",
                        "pcie_switch": "pcie0",
                        "numa_node": None,
                    },
                ]
            }
        )
    )
    gpus = gpus_from_file(path, node="n1")
    assert [(g.gpu_type, g.nvlink_domain, g.numa_node) for g in gpus] == [("H200", "nvl0", 0), ("H200", "nvl1", None)]


def test_simulated_utilisation_follows_the_workloads_util_file(tmp_path: Path) -> None:
    gpus = SimulatedGpus(gpus_from_spec("2xH100", node="n1"))
    util = tmp_path / "util"
    util.write_text("73.5\n")
    samples = gpus.sample({1: util, 0: tmp_path / "missing"})
    assert [s.utilization_pct for s in samples] == [0.0, 73.5]
    assert samples[1].power_w is not None and samples[1].power_w > samples[0].power_w  # type: ignore[operator]
