"""POST register: a new node with its GPUs and topology, once per name."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.test import override_settings

from scheduling.models import Gpu, Leaf, Node, NodeState
from tests.agent_api.conftest import AgentClient, issue_enrolment_token


def registration(name: str, *, gpus: int = 2, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "address": "10.1.4.17",
        "leaf": "leaf-9",
        "spine": "spine-9",
        "simulated": True,
        "agent_version": "0.1.0",
        "gpus": [
            {
                "index": i,
                "uuid": f"GPU-{name}-{i}",
                "name": "NVIDIA H100 80GB HBM3",
                "gpu_type": "H100",
                "memory_mb": 81559,
                "nvlink_domain": "nvl0",
                "pcie_switch": f"pcie{i // 2}",
                "numa_node": None if i == 1 else 0,
            }
            for i in range(gpus)
        ],
    }
    body.update(fields)
    return body


def test_register_creates_the_node_its_switches_and_gpus(db: None) -> None:
    response = AgentClient(issue_enrolment_token()).post("register", registration("node-a01"))
    assert response.status_code == 201
    node = Node.objects.get(name="node-a01")
    assert response.json()["node"] == {"id": node.pk, "name": "node-a01"}
    assert node.leaf.name == "leaf-9" and node.leaf.spine.name == "spine-9"
    assert (node.gpu_type, node.address, node.simulated, node.state) == ("H100", "10.1.4.17", True, NodeState.NOT_READY)
    gpus = list(Gpu.objects.filter(node=node).order_by("index"))
    assert [(g.nvlink_domain, g.pcie_switch, g.numa_node) for g in gpus] == [
        ("node-a01/nvl0", "node-a01/pcie0", "node-a01/numa0"),
        ("node-a01/nvl0", "node-a01/pcie0", "node-a01/numa?"),
    ]


def test_register_answers_the_portal_timings(db: None) -> None:
    body = AgentClient(issue_enrolment_token()).post("register", registration("node-a01")).json()
    assert body["heartbeat_interval_s"] == settings.YARD["HEARTBEAT_INTERVAL_S"]
    assert body["stop_after_s"] == settings.YARD["AGENT_STOP_AFTER_S"]


def test_the_returned_token_speaks_for_the_new_node(db: None) -> None:
    token = AgentClient(issue_enrolment_token()).post("register", registration("node-a01")).json()["token"]
    assert token.startswith("ynd_")
    response = AgentClient(token).post("heartbeat", {"gpus": [], "tasks": []})
    assert response.status_code == 200
    assert response.json()["node_state"] == NodeState.READY


def test_register_reuses_an_existing_leaf(db: None) -> None:
    enrol = AgentClient(issue_enrolment_token())
    enrol.post("register", registration("node-a01"))
    enrol.post("register", registration("node-a02"))
    assert Leaf.objects.filter(name="leaf-9").count() == 1
    assert Node.objects.filter(leaf__name="leaf-9").count() == 2


def test_a_name_registers_once(db: None) -> None:
    enrol = AgentClient(issue_enrolment_token())
    enrol.post("register", registration("node-a01"))
    response = enrol.post("register", registration("node-a01"))
    assert response.status_code == 409
    assert response.json() == {"code": "node_exists"}


def test_register_refuses_mixed_gpu_types(db: None) -> None:
    body = registration("node-a01")
    body["gpus"][1]["gpu_type"] = "A100"
    response = AgentClient(issue_enrolment_token()).post("register", body)
    assert response.status_code == 400
    assert response.json()["code"] == "invalid" and "gpus" in response.json()["errors"]
    assert not Node.objects.exists()


def test_register_refuses_malformed_json(db: None) -> None:
    client = AgentClient(issue_enrolment_token())
    response = client.http.post(
        "/api/agent/v1/register", data="{not json", content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {client.token}"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "invalid"


def test_the_configured_enrolment_token_registers(db: None) -> None:
    raw = "yen_from-the-environment-0123456789"
    with override_settings(YARD={**settings.YARD, "AGENT_ENROLMENT_TOKEN": raw}):
        assert AgentClient(raw).post("register", registration("node-a01")).status_code == 201
