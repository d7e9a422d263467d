"""POST register: the node's multi-node NVLink domain is stored with it, and reaches the scheduler."""

from __future__ import annotations

from scheduling.models import Node
from tests.agent_api.conftest import AgentClient, issue_enrolment_token
from tests.agent_api.test_register import registration


def test_register_stores_the_nodes_fabric_domain(db: None) -> None:
    body = registration("node-a01", fabric_domain="0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/3")
    assert AgentClient(issue_enrolment_token()).post("register", body).status_code == 201
    assert Node.objects.get(name="node-a01").fabric_domain == "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0/3"


def test_an_agent_that_says_no_fabric_domain_registers_a_node_in_none(db: None) -> None:
    assert AgentClient(issue_enrolment_token()).post("register", registration("node-a01")).status_code == 201
    assert Node.objects.get(name="node-a01").fabric_domain == ""


def test_register_refuses_a_fabric_domain_that_is_not_a_string(db: None) -> None:
    response = AgentClient(issue_enrolment_token()).post("register", registration("node-a01", fabric_domain=7))
    assert response.status_code == 400
    assert not Node.objects.filter(name="node-a01").exists()
