"""POST register: the node's CPU cores and memory, and MIG instances as GPUs of their own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent import identity
from nodeagent.agent import Agent
from nodeagent.client import PortalError
from nodeagent.config import AgentConfig
from nodeagent.simgpu import simulated_gpus
from scheduling.models import Gpu, Node
from tests.agent_api.conftest import AgentClient, issue_enrolment_token
from tests.agent_api.test_register import registration


class DjangoPortal:
    """Stands in for nodeagent.client.PortalClient: the agent's own request, through the real views."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float) -> None:
        self.client = AgentClient(token)

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post(path, body)
        if response.status_code >= 400:
            raise PortalError(response.status_code, response.json())
        answer: dict[str, Any] = response.json()
        return answer


def register_simulated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, **options: Any) -> Node:
    monkeypatch.setattr(identity, "PortalClient", DjangoPortal)
    source = simulated_gpus(node=name, **options)
    config = AgentConfig(portal="http://portal", token=issue_enrolment_token(), name=name, state_dir=tmp_path / name)
    agent = Agent(config, source)
    agent.state_dir.mkdir(parents=True)
    assert agent.registration.node_token() is not None
    return Node.objects.get(name=name)


def test_register_stores_the_nodes_cores_and_memory(db: None) -> None:
    response = AgentClient(issue_enrolment_token()).post("register", registration("node-a01", cpus=112, memory_mb=2_097_152))
    assert response.status_code == 201
    node = Node.objects.get(name="node-a01")
    assert (node.cpus, node.memory_mb) == (112, 2_097_152)


def test_an_older_agent_without_cores_and_memory_registers_them_as_unknown(db: None) -> None:
    body = registration("node-a01")
    assert "cpus" not in body and "memory_mb" not in body
    assert AgentClient(issue_enrolment_token()).post("register", body).status_code == 201
    node = Node.objects.get(name="node-a01")
    assert (node.cpus, node.memory_mb) == (0, 0)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("cpus", -1, "must be between 0 and 16384"),
        ("cpus", 100_000, "must be between 0 and 16384"),
        ("memory_mb", 2**40, "must be between 0 and 67108864"),
        ("cpus", 1.5, "must be an integer"),
        ("memory_mb", "lots", "must be an integer"),
    ],
)
def test_out_of_range_cores_or_memory_are_refused_by_name(db: None, field: str, value: Any, message: str) -> None:
    response = AgentClient(issue_enrolment_token()).post("register", registration("node-a01", **{field: value}))
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"
    assert response.json()["errors"] == {field: [message]}
    assert not Node.objects.exists()


def test_a_simulated_agent_registers_its_mig_instances(db: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    node = register_simulated(monkeypatch, tmp_path, "node-m01", simulate="2xH100", mig="0:1g.10gb*7")
    assert (node.gpu_type, node.cpus, node.memory_mb) == ("H100", 28, 512 * 1024)
    rows = list(Gpu.objects.filter(node=node).order_by("index"))
    whole, instances = rows[0], rows[1:]
    assert (whole.index, whole.gpu_type, whole.mig_profile, whole.parent_uuid) == (1, "H100", "", "")
    assert [g.index for g in instances] == list(range(128, 135))
    assert {(g.gpu_type, g.mig_profile) for g in instances} == {("H100.1g.10gb", "1g.10gb")}
    assert all(g.uuid.startswith("MIG-") for g in instances)
    parent = simulated_gpus(node="node-m01", simulate="2xH100").gpus()[0].uuid
    assert {g.parent_uuid for g in instances} == {parent}
    assert {(g.nvlink_domain, g.pcie_switch, g.numa_node) for g in instances} == {
        ("node-m01/nvl0", "node-m01/pcie0", "node-m01/numa0")
    }


def test_a_node_whose_gpus_are_all_mig_keeps_the_whole_gpu_type(
    db: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    node = register_simulated(monkeypatch, tmp_path, "node-m02", simulate="1xA100", mig="0:3g.40gb*2")
    assert node.gpu_type == "A100"
    assert set(Gpu.objects.filter(node=node).values_list("gpu_type", flat=True)) == {"A100.3g.40gb"}


def mig_entry(index: int, **fields: Any) -> dict[str, Any]:
    entry = {
        "index": index,
        "uuid": f"MIG-x-{index}",
        "name": "NVIDIA H100 80GB HBM3 MIG 1g.10gb",
        "gpu_type": "H100.1g.10gb",
        "memory_mb": 9856,
        "nvlink_domain": "nvl0",
        "pcie_switch": "pcie0",
        "numa_node": 0,
        "mig_profile": "1g.10gb",
        "parent_uuid": "GPU-node-a01-0",
    }
    return {**entry, **fields}


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        (mig_entry(128, gpu_type="A100.1g.10gb"), "a node holds GPUs of one type"),
        (mig_entry(128, gpu_type="H100"), "GPU 128: a MIG instance has gpu_type <parent type>.1g.10gb and a parent_uuid"),
        (mig_entry(128, parent_uuid=""), "GPU 128: a MIG instance has gpu_type <parent type>.1g.10gb and a parent_uuid"),
        (mig_entry(128, mig_profile="", gpu_type="H100"), "GPU 128: parent_uuid is for MIG instances only"),
    ],
)
def test_an_inconsistent_mig_entry_is_refused(db: None, entry: dict[str, Any], error: str) -> None:
    body = registration("node-a01", gpus=1)
    body["gpus"].append(entry)
    response = AgentClient(issue_enrolment_token()).post("register", body)
    assert response.status_code == 400
    assert response.json()["errors"] == {"gpus": [error]}


def test_a_malformed_mig_profile_is_refused(db: None) -> None:
    body = registration("node-a01", gpus=1)
    body["gpus"].append(mig_entry(128, mig_profile="big slice"))
    response = AgentClient(issue_enrolment_token()).post("register", body)
    assert response.status_code == 400
    assert "gpus[1].mig_profile" in response.json()["errors"]
