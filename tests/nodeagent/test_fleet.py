"""The fleet runner: many simulated agents as threads in one process."""

from __future__ import annotations

import json
from pathlib import Path

from nodeagent.fleet import _parser, build_fleet, nodes_from_spec
from tests.nodeagent.conftest import kill_group, task_spec
from tests.nodeagent.fakeportal import ENROLMENT_TOKEN, FakePortal


def test_fleet_spec_groups_nodes_under_leaves_and_spines() -> None:
    nodes = nodes_from_spec("12x8xH100", nodes_per_leaf=2, leaves_per_spine=3, prefix="node-")
    assert [(n.name, n.leaf, n.spine) for n in nodes[5:7]] == [
        ("node-005", "leaf-2", "spine-0"),
        ("node-006", "leaf-3", "spine-1"),
    ]
    assert {n.simulate for n in nodes} == {"8xH100"}


def test_fleet_registers_every_node_and_runs_their_workloads(portal: FakePortal, tmp_path: Path) -> None:
    args = _parser().parse_args(
        [
            "--portal",
            portal.url,
            "--token",
            ENROLMENT_TOKEN,
            "--simulate-nodes",
            "3x2xH100",
            "--state-dir",
            str(tmp_path),
            "--nodes-per-leaf",
            "2",
            "--heartbeat-interval",
            "0.3",
            "--tick",
            "0.1",
        ]
    )
    fleet = build_fleet(args)
    fleet.stagger_s = 0.2
    fleet.start()
    try:
        portal.wait_for(lambda: all(portal.heartbeats(f"node-00{i}") for i in range(3)), what="3 nodes heartbeating")
        leaves = [portal.nodes[f"node-00{i}"].registration["leaf"] for i in range(3)]
        assert leaves == ["leaf-0", "leaf-0", "leaf-1"]
        portal.set_desired("node-002", [task_spec(40, "exit 0", gpus=[1])])
        status = portal.wait_for(lambda: portal.statuses_of(40, "exited"), what="task 40 on node-002")[-1]
        assert status["exit_code"] == 0
    finally:
        fleet.stop()
        for agent in fleet.agents:
            for record in agent.records.values():
                if record.pid:
                    kill_group(record.pid)
    assert not any(thread.is_alive() for thread in fleet.threads)


def test_fleet_takes_node_tokens_from_a_file(portal: FakePortal, tmp_path: Path) -> None:
    tokens = {f"node-00{i}": portal.add_node(f"node-00{i}") for i in range(2)}
    token_file = tmp_path / "tokens.json"
    token_file.write_text(json.dumps(tokens))
    args = _parser().parse_args(
        ["--portal", portal.url, "--token", str(token_file), "--simulate-nodes", "2x1xH100", "--state-dir", str(tmp_path)]
    )
    assert [agent.config.token for agent in build_fleet(args).agents] == [tokens["node-000"], tokens["node-001"]]


def test_fleet_runs_the_nodes_of_a_seed_demo_tokens_file(tmp_path: Path) -> None:
    tokens_file = tmp_path / "agent-tokens.json"
    tokens_file.write_text(
        json.dumps(
            {
                "nodes": {
                    "node-b02": {"token": "ynd_b", "leaf": "leaf-1", "spine": "spine-0", "gpu_type": "H200", "gpus": 4},
                    "node-a01": {"token": "ynd_a", "leaf": "leaf-0", "spine": "spine-0", "gpu_type": "H100", "gpus": 8},
                },
                "enrolment": "yen_x",
            }
        )
    )
    args = _parser().parse_args(["--portal", "http://p", "--tokens-file", str(tokens_file), "--state-dir", str(tmp_path)])
    agents = build_fleet(args).agents
    assert [(a.config.name, a.config.token, a.config.leaf) for a in agents] == [
        ("node-a01", "ynd_a", "leaf-0"),
        ("node-b02", "ynd_b", "leaf-1"),
    ]
    assert [len(a.gpus.gpus()) for a in agents] == [8, 4] and agents[1].gpus.gpus()[0].gpu_type == "H200"
