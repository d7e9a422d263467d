"""The journal: an agent killed with SIGKILL and restarted adopts its workloads and starts nothing twice.
The agent runs as a real subprocess (`python -m nodeagent`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.nodeagent.conftest import kill_group, task_spec, wait_gone
from tests.nodeagent.fakeportal import FakePortal

MARK = "YARD_TEST_AGENT_RUN"


class AgentProcess:
    def __init__(self, portal: FakePortal, state_dir: Path, token: str) -> None:
        self.args = [
            sys.executable,
            "-m",
            "nodeagent",
            "--portal",
            portal.url,
            "--token",
            token,
            "--name",
            "node-r1",
            "--address",
            "127.0.0.1",
            "--simulate",
            "8xH100",
            "--state-dir",
            str(state_dir),
        ]
        self.log = state_dir.parent / "agent.log"
        self.process: subprocess.Popen[bytes] | None = None
        # Its workloads inherit it: task 30 of another test running at the same time (another xdist
        # worker, another checkout) is not one of this agent's.
        self.mark = f"{MARK}={uuid.uuid4().hex}"

    def start(self) -> None:
        name, _, value = self.mark.partition("=")
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, name: value})

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)


@pytest.fixture
def agent_process(portal: FakePortal, tmp_path: Path) -> Iterator[AgentProcess]:
    agent = AgentProcess(portal, tmp_path / "state", portal.add_node("node-r1"))
    yield agent
    if agent.process is not None and agent.process.poll() is None:
        agent.kill()


def _pids(path: Path) -> list[int]:
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _task_processes(task_id: int, mark: str) -> list[int]:
    """Live processes whose environment says they belong to this task of the agent marked `mark`: the
    duplicate detector."""
    found = []
    needle = f"YARD_TASK_ID={task_id}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0")
            state = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        mine = needle in environ and mark.encode() in environ
        if mine and state != "Z" and int(entry.name) == os.getpgid(int(entry.name)):
            found.append(int(entry.name))
    return found


def test_restarted_agent_adopts_running_workloads_and_starts_nothing_twice(
    portal: FakePortal, agent_process: AgentProcess, tmp_path: Path
) -> None:
    long_runs, short_runs = tmp_path / "long.pids", tmp_path / "short.pids"
    portal.set_desired(
        "node-r1",
        [
            task_spec(30, f"echo $$ >> {long_runs}; exec sleep 60"),
            task_spec(31, f"echo $$ >> {short_runs}; sleep 2; exit 7"),
        ],
    )
    agent_process.start()
    leader = int(portal.wait_for(lambda: portal.statuses_of(30, "running"), what="task 30 running")[0]["pid"])
    portal.wait_for(lambda: portal.statuses_of(31, "running"), what="task 31 running")
    agent_process.kill()
    time.sleep(2.5)  # task 31 ends while no agent watches it
    beats = len(portal.heartbeats("node-r1"))
    agent_process.start()

    def adopted() -> bool:
        new_beats = portal.heartbeats("node-r1")[beats:]
        return any(t["task_id"] == 30 and t["pid"] == leader for b in new_beats for t in b["tasks"])

    portal.wait_for(adopted, what="task 30 adopted after the restart")
    status = portal.wait_for(lambda: portal.statuses_of(31, "exited"), what="task 31's exit reported")[-1]
    assert status["exit_code"] == 7
    assert _task_processes(30, agent_process.mark) == [leader]
    assert len(_pids(long_runs)) == 1 and len(_pids(short_runs)) == 1

    portal.set_desired("node-r1", [])  # the adopted task is fenced like any other
    assert portal.wait_for(lambda: portal.statuses_of(30, "exited"), what="task 30 fenced")[-1]["stop_cause"] == "fenced"
    assert wait_gone(leader, timeout=2)
    kill_group(leader)


def test_agent_exits_on_sigterm_and_leaves_its_workloads_running(portal: FakePortal, agent_process: AgentProcess) -> None:
    portal.set_desired("node-r1", [task_spec(32, "exec sleep 60")])
    agent_process.start()
    leader = int(portal.wait_for(lambda: portal.statuses_of(32, "running"), what="task 32 running")[0]["pid"])
    assert agent_process.process is not None
    agent_process.process.send_signal(signal.SIGTERM)
    assert agent_process.process.wait(timeout=10) == 0
    try:
        assert _task_processes(32, agent_process.mark) == [leader]
    finally:
        kill_group(leader)
