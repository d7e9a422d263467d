"""The node's CPU cores and memory: read from the host for real GPUs, configured (or scaled by the GPU
count) for simulated ones, and sent with the registration."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nodeagent.__main__ import main
from nodeagent.agent import Agent
from nodeagent.config import AgentConfig, ConfigError, build_config, load_toml
from nodeagent.fleet import _parser, build_fleet, nodes_from_file
from nodeagent.simgpu import SimulatedGpus, TopologyError, gpus_from_spec, simulated_gpus
from nodeagent.telemetry import NvmlGpus, host_cpus, host_memory_mb
from tests.nodeagent.fakeportal import ENROLMENT_TOKEN, FakePortal
from tests.nodeagent.test_nvml import PAIRS, FakeNvml, hgx

GIB_MB = 1024


def test_the_host_reports_its_affinity_cores() -> None:
    assert host_cpus() == len(os.sched_getaffinity(0))


def test_the_host_memory_is_memtotal_in_mib(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131891256 kB\nMemFree:         1000 kB\n")
    assert host_memory_mb(meminfo) == 131891256 // 1024


def test_unreadable_host_memory_is_unknown(tmp_path: Path) -> None:
    assert host_memory_mb(tmp_path / "missing") == 0
    (tmp_path / "odd").write_text("MemTotal: lots\n")
    assert host_memory_mb(tmp_path / "odd") == 0


def test_real_gpus_carry_the_hosts_cores_and_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    FakeNvml(monkeypatch, hgx({}), ancestor=PAIRS)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2113929216 kB\n")
    source = NvmlGpus(kmsg=tmp_path / "kmsg", meminfo=meminfo)
    assert (source.cpus, source.memory_mb) == (len(os.sched_getaffinity(0)), 2016 * GIB_MB)


def test_a_simulated_node_looks_like_a_server_of_its_gpu_count() -> None:
    eight = SimulatedGpus(gpus_from_spec("8xH100", node="n1"))
    assert (eight.cpus, eight.memory_mb) == (112, 2048 * GIB_MB)
    two = SimulatedGpus(gpus_from_spec("2xH100", node="n1"))
    assert (two.cpus, two.memory_mb) == (28, 512 * GIB_MB)


def test_mig_instances_do_not_count_as_more_gpus() -> None:
    source = simulated_gpus(node="n1", simulate="2xH100", mig="0:1g.10gb*7")
    assert len(source.gpus()) == 8
    assert (source.cpus, source.memory_mb) == (28, 512 * GIB_MB)


def test_configured_cores_and_memory_win() -> None:
    source = simulated_gpus(node="n1", simulate="8xH100", cpus=64, memory_mb=1024 * GIB_MB)
    assert (source.cpus, source.memory_mb) == (64, 1024 * GIB_MB)


def test_non_positive_simulated_resources_are_refused() -> None:
    with pytest.raises(TopologyError, match="--sim-cpus must be a positive integer"):
        simulated_gpus(node="n1", simulate="8xH100", cpus=0)


def test_the_config_file_gives_simulated_resources(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('simulate = "4xH100"\nsim_cpus = 48\nsim_memory_mb = 524288\nsim_mig = "0:3g.40gb*2"\n')
    config = build_config(file_values=load_toml(path), cli_values={"portal": "http://p", "token": "t"})
    assert (config.sim_cpus, config.sim_memory_mb, config.sim_mig) == (48, 524288, "0:3g.40gb*2")


def test_a_config_file_with_a_bad_core_count_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text('simulate = "4xH100"\nsim_cpus = "many"\n')
    with pytest.raises(ConfigError, match="sim_cpus must be a positive integer"):
        load_toml(path)


def test_simulated_resources_on_a_real_node_are_refused() -> None:
    with pytest.raises(ConfigError, match="--sim-cpus is for simulated nodes only"):
        build_config(file_values={}, cli_values={"portal": "http://p", "token": "t", "sim_cpus": 8})
    with pytest.raises(ConfigError, match="--sim-mig is for simulated nodes only"):
        build_config(file_values={}, cli_values={"portal": "http://p", "token": "t", "sim_mig": "0:7g.80gb"})


def test_discover_prints_the_simulated_resources_and_mig(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["discover", "--simulate", "2xH100", "--sim-cpus", "64", "--sim-memory-mb", "1000", "--sim-mig", "1:7g.80gb"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["cpus"], report["memory_mb"]) == (64, 1000)
    assert [(g["index"], g["gpu_type"]) for g in report["gpus"]] == [(0, "H100"), (136, "H100.7g.80gb")]


def test_a_bad_sim_mig_on_the_command_line_exits_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["discover", "--simulate", "2xH100", "--sim-mig", "0:9g.90gb"]) == 2
    assert "no MIG profile '9g.90gb'" in capsys.readouterr().err


def test_the_registration_carries_cores_and_memory(portal: FakePortal, tmp_path: Path) -> None:
    source = simulated_gpus(node="node-r1", simulate="8xH100", cpus=96, mig="0:1g.10gb*7")
    config = AgentConfig(portal=portal.url, token=ENROLMENT_TOKEN, name="node-r1", address="127.0.0.1", state_dir=tmp_path / "r1")
    agent = Agent(config, source)
    agent.state_dir.mkdir(parents=True)
    assert agent.registration.node_token()
    body = portal.nodes["node-r1"].registration
    assert (body["cpus"], body["memory_mb"]) == (96, 2048 * GIB_MB)
    assert [g["mig_profile"] for g in body["gpus"]].count("1g.10gb") == 7


def test_the_fleet_passes_simulated_resources_to_its_nodes(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.toml"
    nodes.write_text(
        '[[nodes]]\nname = "node-a"\nsimulate = "8xH100"\nsim_cpus = 200\nsim_mig = "0:3g.40gb*2"\n'
        '[[nodes]]\nname = "node-b"\nsimulate = "4xH100"\n'
    )
    args = _parser().parse_args(
        ["--portal", "http://127.0.0.1:9", "--token", "yen_x", "--simulate-nodes", str(nodes), "--sim-memory-mb", "4096"]
    )
    args.state_dir = tmp_path / "fleet"
    fleet = build_fleet(args)
    a, b = (agent.gpus for agent in fleet.agents)
    assert (a.cpus, a.memory_mb, b.cpus, b.memory_mb) == (200, 4096, 56, 4096)
    assert [g.index for g in a.gpus()][-2:] == [128, 129]


def test_a_node_list_with_a_bad_core_count_is_refused(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"nodes": [{"name": "node-a", "sim_cpus": -1}]}))
    with pytest.raises(ConfigError, match="sim_cpus must be a positive integer"):
        nodes_from_file(nodes)
