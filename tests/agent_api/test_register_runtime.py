"""The node's container runtime: the agent says which it found at registration and in every heartbeat,
and the portal keeps it on the node (only nodes with one are given jobs that name an image)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from nodeagent import identity
from nodeagent.agent import Agent
from nodeagent.config import AgentConfig
from nodeagent.simgpu import simulated_gpus
from scheduling.models import Node
from tests.agent_api.conftest import AgentClient, heartbeat_body, issue_enrolment_token
from tests.agent_api.test_register import registration
from tests.agent_api.test_register_resources import DjangoPortal


def register_agent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str, **options: Any) -> Node:
    """A real agent (its own start-up detection of the runtime) registering through the real views."""
    monkeypatch.setattr(identity, "PortalClient", DjangoPortal)
    config = AgentConfig(portal="http://portal", token=issue_enrolment_token(), name=name, state_dir=tmp_path / name, **options)
    agent = Agent(config, simulated_gpus(node=name, simulate="2xH100"))
    agent.state_dir.mkdir(parents=True)
    assert agent.registration.node_token() is not None
    return Node.objects.get(name=name)


def test_an_agent_with_containers_off_registers_a_node_without_a_runtime(db: None, monkeypatch, tmp_path) -> None:
    node = register_agent(monkeypatch, tmp_path, "ct-off", container_runtime="none")
    assert node.container_runtime == ""
    assert node.container_runtime_note.startswith("containers are off (--container-runtime none)")


@pytest.mark.skipif(shutil.which("runc") is None or os.geteuid() != 0, reason="needs runc and root (scripts/services.sh)")
def test_an_agent_that_finds_runc_registers_it(db: None, monkeypatch, tmp_path) -> None:
    node = register_agent(monkeypatch, tmp_path, "ct-runc")
    assert node.container_runtime == "runc"
    assert node.container_runtime_note.startswith("container runtime: runc (")


def test_an_older_agent_that_does_not_say_registers_a_node_without_one(db: None) -> None:
    assert AgentClient(issue_enrolment_token()).post("register", registration("old-agent")).status_code == 201
    assert Node.objects.get(name="old-agent").container_runtime == ""


def test_a_heartbeat_updates_the_runtime_and_one_that_does_not_say_keeps_it(db: None) -> None:
    token = issue_enrolment_token()
    answer = AgentClient(token).post("register", registration("hb-node"))
    agent = AgentClient(answer.json()["token"])
    note = "container runtime: runc (/usr/sbin/runc, state in /var/lib/yard/runc)"
    assert agent.post("heartbeat", heartbeat_body(container_runtime="runc", container_runtime_note=note)).status_code == 200
    node = Node.objects.get(name="hb-node")
    assert (node.container_runtime, node.container_runtime_note) == ("runc", note)
    assert agent.post("heartbeat", heartbeat_body()).status_code == 200  # an older agent's: nothing said
    assert Node.objects.get(name="hb-node").container_runtime == "runc"
    off = "containers are off (--container-runtime none): a job naming an image fails"
    assert agent.post("heartbeat", heartbeat_body(container_runtime="", container_runtime_note=off)).status_code == 200
    node = Node.objects.get(name="hb-node")
    assert (node.container_runtime, node.container_runtime_note) == ("", off)
