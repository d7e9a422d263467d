"""Every agent API field is checked against its range, with a 400 naming the field and nothing written; and
a real agent whose GPUs report nonsense keeps its node: it drops what the portal would refuse, and after a
refused heartbeat the next one is accepted."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodeagent import protocol as agent_protocol
from nodeagent.agent import Agent
from nodeagent.config import AgentConfig
from nodeagent.simgpu import SimulatedGpus, gpus_from_spec
from nodeagent.topology import GpuSample
from scheduling.models import Gpu, GpuWindow, Node, NodeState, XidEvent
from tests.agent_api.conftest import AgentClient, issue_enrolment_token


def _gpu(**fields: Any) -> dict[str, Any]:
    return {"index": 0, "utilization_pct": 50.0, "memory_used_mb": 1000.0, "temperature_c": 40.0, "power_w": 300.0, **fields}


@pytest.mark.parametrize(
    ("gpu", "field"),
    [
        (_gpu(xid_errors=[2**31]), "gpus[0].xid_errors[0]"),
        (_gpu(utilization_pct=-1), "gpus[0].utilization_pct"),
        (_gpu(utilization_pct=1e308), "gpus[0].utilization_pct"),
        (_gpu(memory_used_mb=-5), "gpus[0].memory_used_mb"),
        (_gpu(temperature_c=1e308), "gpus[0].temperature_c"),
        (_gpu(power_w=-1), "gpus[0].power_w"),
        (_gpu(xid_errors=[79] * 10_000), "gpus[0].xid_errors"),
    ],
)
def test_an_out_of_range_reading_is_refused_naming_the_field(agent: AgentClient, nodes: list[Node], gpu, field) -> None:
    before = list(Gpu.objects.filter(node=nodes[0]).values_list("utilization_pct", flat=True))
    answer = agent.post("heartbeat", {"gpus": [gpu], "tasks": []})
    assert answer.status_code == 400, answer.content
    body = answer.json()
    assert body["code"] == "invalid" and field in body["errors"], body
    assert not XidEvent.objects.exists() and not GpuWindow.objects.exists()
    assert list(Gpu.objects.filter(node=nodes[0]).values_list("utilization_pct", flat=True)) == before


def test_a_window_of_impossible_utilisation_is_refused(agent: AgentClient, nodes: list[Node]) -> None:
    window = {"index": 0, "start": 1796012000.0, "samples": 6, "utilization_sum": -1.0, "utilization_max": 1e308}
    answer = agent.post("heartbeat", {"gpus": [], "tasks": [], "windows": [window]})
    assert answer.status_code == 400 and any(k.startswith("windows[0].") for k in answer.json()["errors"])
    assert not GpuWindow.objects.exists()


class NonsenseGpus(SimulatedGpus):
    """Simulated GPUs that read what a broken NVML might: XIDs past 2^31, a storm of them, negative and
    absurd utilisation."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def sample(self, util_files: Mapping[int, Path]) -> list[GpuSample]:
        self.calls += 1
        first, *rest = super().sample(util_files)
        odd = replace(first, xid_errors=[2**31] + [31] * 10_000 + [13], utilization_pct=-1.0 if self.calls % 2 else 1e308)
        return [odd, *rest]


@pytest.fixture
def run_agent(live_server: Any, settings: Any, tmp_path: Path) -> Iterator[Callable[[SimulatedGpus], Agent]]:
    settings.YARD = {**settings.YARD, "HEARTBEAT_INTERVAL_S": 0.3}
    started: list[tuple[Agent, threading.Thread]] = []

    def start(gpus: SimulatedGpus) -> Agent:
        config = AgentConfig(
            portal=live_server.url,
            token=issue_enrolment_token(),
            name="odd-01",
            address="127.0.0.1",
            leaf="leaf-0",
            spine="spine-0",
            state_dir=tmp_path / "odd-01",
            heartbeat_interval_s=0.3,
            tick_s=0.1,
        )
        agent = Agent(config, gpus)
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        started.append((agent, thread))
        return agent

    yield start
    for agent, thread in started:
        agent.stop_event.set()
        thread.join(timeout=10)


def _wait(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.django_db(transaction=True)
def test_an_agent_with_nonsense_readings_keeps_its_node_and_says_what_it_dropped(
    run_agent: Callable[[SimulatedGpus], Agent], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="nodeagent")
    run_agent(NonsenseGpus(gpus_from_spec("2xH100", node="odd-01")))
    _wait(lambda: XidEvent.objects.filter(code=13).exists(), "the good XID stored")
    beats = Node.objects.get(name="odd-01").last_heartbeat
    _wait(lambda: Node.objects.get(name="odd-01").last_heartbeat > beats, "later heartbeats accepted too")
    node = Node.objects.get(name="odd-01")
    assert node.state == NodeState.READY
    assert not XidEvent.objects.filter(code=2**31).exists()
    # A storm of 10,000 is capped per heartbeat, and stored as one row per GPU and code with its count.
    assert all(e.count <= agent_protocol.MAX_XIDS_PER_GPU for e in XidEvent.objects.filter(code=31))
    assert Gpu.objects.get(node=node, index=0).utilization_pct is None  # dropped, never stored as -1 or 1e308
    said = caplog.text
    assert "dropping utilization_pct=-1.0" in said and "XID code(s) outside" in said


@pytest.mark.django_db(transaction=True)
def test_after_a_refused_heartbeat_the_agent_drops_what_was_refused_and_the_next_is_accepted(
    run_agent: Callable[[SimulatedGpus], Agent], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An agent that does not clean its XIDs (an older one, say): the portal refuses the heartbeat that
    # carries 2^31, and the agent must not send it again and again.
    monkeypatch.setattr(agent_protocol, "clean_xids", lambda codes, where: list(codes))
    caplog.set_level(logging.ERROR, logger="nodeagent")
    gpus = NonsenseGpus(gpus_from_spec("1xH100", node="odd-01"))
    gpus.sample = lambda util_files: [  # type: ignore[method-assign]
        GpuSample(uuid=g.uuid, index=g.index, utilization_pct=10.0, memory_used_mb=1, temperature_c=30.0, power_w=80.0,
                  xid_errors=[2**31] if gpus.calls == 0 and not gpus.__dict__.__setitem__("calls", 1) else [])
        for g in gpus.gpus()
    ]  # fmt: skip
    run_agent(gpus)
    _wait(lambda: "portal refused the heartbeat" in caplog.text, "the refused heartbeat")
    refused_at = time.time()
    _wait(
        lambda: (n := Node.objects.filter(name="odd-01").first()) and n.last_heartbeat.timestamp() > refused_at + 0.2,
        "a heartbeat accepted after the refusal",
    )
    assert Node.objects.get(name="odd-01").state == NodeState.READY
    assert not XidEvent.objects.exists()


@pytest.mark.django_db
def test_the_longest_names_the_protocol_allows_are_stored(db: None) -> None:
    from .test_register import registration

    body = registration("n" * 63)
    for gpu in body["gpus"]:
        gpu["nvlink_domain"], gpu["pcie_switch"], gpu["uuid"] = "v" * 40, "p" * 40, f"GPU-long-{gpu['index']}"
    assert AgentClient(issue_enrolment_token()).post("register", body).status_code == 201
    assert Gpu.objects.filter(nvlink_domain="n" * 63 + "/" + "v" * 40).count() == 2
