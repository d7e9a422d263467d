"""Fixtures for agent tests: a fake portal, agents in threads, and cleanup of every process group."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent import Agent
from nodeagent.config import AgentConfig
from nodeagent.launcher import group_alive
from nodeagent.simgpu import SimulatedGpus, gpus_from_spec
from tests.nodeagent.fakeportal import FakePortal


def task_spec(task_id: int, command: str, **overrides: Any) -> dict[str, Any]:
    """A desired-list entry as the portal sends it (docs/agent-api.md)."""
    spec: dict[str, Any] = {
        "task_id": task_id,
        "job_id": 100 + task_id,
        "attempt": 1,
        "kind": "batch",
        "rank": 0,
        "world_size": 1,
        "node_rank": 0,
        "local_rank": 0,
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "gpus": [0],
        "command": command,
        "env": {},
        "checkpoint_dir": None,
        "time_limit_s": None,
        "action": "run",
        "grace_s": 5,
        "stop_reason": None,
        "user": "nobody",
    }
    spec.update(overrides)
    return spec


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@pytest.fixture
def portal() -> Iterator[FakePortal]:
    fake = FakePortal().start()
    yield fake
    fake.stop()


class RunningAgent:
    def __init__(self, agent: Agent, thread: threading.Thread) -> None:
        self.agent = agent
        self.thread = thread

    def record(self, task_id: int, attempt: int = 1) -> Any:
        return self.agent.records.get((task_id, attempt))

    def stop(self) -> None:
        self.agent.stop_event.set()
        self.thread.join(timeout=10)


@pytest.fixture
def start_agent(portal: FakePortal, tmp_path: Path) -> Iterator[Callable[..., RunningAgent]]:
    """Start an Agent (8 simulated H100s) in a thread, registered with `portal` under a node token."""
    started: list[RunningAgent] = []

    def start(name: str = "node-t1", **overrides: Any) -> RunningAgent:
        token = overrides.pop("token", None)
        if token is None:
            token = portal.nodes[name].token if name in portal.nodes else portal.add_node(name)
        config = AgentConfig(
            portal=portal.url,
            token=token,
            name=name,
            address="127.0.0.1",
            state_dir=tmp_path / name,
            heartbeat_interval_s=0.3,
            tick_s=0.05,
        )
        config = replace(config, **overrides)
        agent = Agent(config, SimulatedGpus(gpus_from_spec("8xH100", node=name)))
        thread = threading.Thread(target=agent.run, daemon=True)
        thread.start()
        running = RunningAgent(agent, thread)
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()
        for record in running.agent.records.values():
            if record.pid is not None:
                kill_group(record.pid)


def wait_gone(pgid: int, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not group_alive(pgid):
            return True
        time.sleep(0.05)
    return False
