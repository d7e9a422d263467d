"""--run-as-owner: a task runs as the local account of its owner, and cannot touch the agent's files.

These need root (the agent switches accounts) and run as `nobody`, which every Debian system has.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent import Agent, AgentFatal
from nodeagent.config import AgentConfig, ConfigError, build_config, load_toml
from nodeagent.launcher import SETPRIV, closed_to_others
from nodeagent.simgpu import SimulatedGpus, gpus_from_spec
from tests.nodeagent.conftest import RunningAgent, task_spec, wait_gone
from tests.nodeagent.fakeportal import FakePortal

StartAgent = Callable[..., RunningAgent]

needs_root = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="switching accounts needs root and setpriv")
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory task owners can reach (pytest's own temporary folders are mode 0700). Ask for
    it before start_agent, so that it is removed after the agents have stopped."""
    path = Path(tempfile.mkdtemp(prefix="yard-run-as-"))
    path.chmod(0o711)
    yield path / "agent"
    shutil.rmtree(path, ignore_errors=True)


def _group_uids(pgid: int) -> set[int]:
    uids = set()
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2]) == pgid:
                uids.add(entry.stat().st_uid)
        except (OSError, IndexError, ValueError):
            continue
    return uids


def _exited(portal: FakePortal, task_id: int) -> dict[str, Any]:
    return portal.wait_for(lambda: portal.statuses_of(task_id, "exited"), timeout=20, what=f"task {task_id} exited")[-1]


@needs_root
def test_a_task_runs_as_its_owner_in_a_directory_it_owns(state_dir: Path, portal: FakePortal, start_agent: StartAgent) -> None:
    agent = start_agent(run_as_owner=True, state_dir=state_dir)
    script = (
        'id -un > who; id -u >> who; echo "$HOME" >> who; echo "$YARD_WORKDIR" >> who; '
        'touch "$YARD_CHECKPOINT_DIR/saved"; echo "hello from $(id -un)"'
    )
    portal.set_desired("node-t1", [task_spec(40, script, user="nobody")])
    assert _exited(portal, 40)["exit_code"] == 0
    record = agent.record(40)
    run_dir = state_dir / "tasks" / "40-1" / "work"
    assert (record.run_as, record.run_dir) == ("nobody", run_dir)
    assert (run_dir / "who").read_text().split() == ["nobody", str(NOBODY.pw_uid), NOBODY.pw_dir, str(run_dir)]
    assert (run_dir / "who").stat().st_uid == NOBODY.pw_uid
    assert (Path(record.checkpoint_dir) / "saved").stat().st_uid == NOBODY.pw_uid
    # The log and the exit status are the agent's, in a directory the task may cross but not change.
    task_dir = run_dir.parent
    assert (task_dir.stat().st_uid, task_dir.stat().st_mode & 0o777) == (0, 0o711)
    assert record.log_path.parent == task_dir and record.log_path.stat().st_uid == 0
    # Other accounts on the node read neither the log nor the work or checkpoint directories.
    assert record.log_path.stat().st_mode & 0o777 == 0o600
    assert {run_dir.stat().st_mode & 0o777, Path(record.checkpoint_dir).stat().st_mode & 0o777} == {0o700}
    assert "hello from nobody" in record.log_path.read_text()  # written through the inherited descriptor


@needs_root
def test_the_owner_cannot_write_where_the_agent_keeps_its_files(
    state_dir: Path, portal: FakePortal, start_agent: StartAgent
) -> None:
    start_agent(run_as_owner=True, state_dir=state_dir)
    portal.set_desired("node-t1", [task_spec(41, 'echo 99 > "$YARD_WORKDIR/../exit-status"')])
    status = _exited(portal, 41)
    assert status["exit_code"] != 0  # permission denied, and the real status reported, not the forged 99
    assert status["exit_code"] != 99


@needs_root
def test_a_stop_reaches_a_task_run_as_its_owner(state_dir: Path, portal: FakePortal, start_agent: StartAgent) -> None:
    start_agent(run_as_owner=True, state_dir=state_dir)
    spec = task_spec(42, "exec sleep 60", user="nobody", grace_s=5)
    portal.set_desired("node-t1", [spec])
    pid = int(portal.wait_for(lambda: portal.statuses_of(42, "running"), what="task 42 running")[0]["pid"])
    # The group leader is the agent's wrapper (it records the exit status); the workload is the owner's.
    assert portal.wait_for(lambda: _group_uids(pid) == {0, NOBODY.pw_uid}, what="the workload as nobody")
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    assert _exited(portal, 42)["stopped_by"] == "sigterm"
    assert wait_gone(pid, timeout=2)


@needs_root
@pytest.mark.parametrize(
    ("user", "message"),
    [
        ("no-such-person", "the job's owner 'no-such-person' has no local account on node node-t1"),
        ("root", "refusing to run a task as root"),
        ("", "the portal sent no owner for this task"),
    ],
)
def test_a_task_without_a_usable_account_fails_with_the_reason_in_its_log(
    state_dir: Path, portal: FakePortal, start_agent: StartAgent, user: str, message: str
) -> None:
    start_agent(run_as_owner=True, state_dir=state_dir)
    portal.set_desired("node-t1", [task_spec(43, "touch ran", user=user)])
    status = _exited(portal, 43)
    assert status["exit_code"] is None and status["signal"] is None
    task_dir = state_dir / "tasks" / "43-1"
    assert message in (task_dir / "output.log").read_text()
    assert not (task_dir / "ran").exists() and not (task_dir / "work").exists()


def test_a_state_dir_owners_cannot_reach_stops_the_agent_with_the_fix(portal: FakePortal, tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir()
    closed.chmod(0o700)
    config = AgentConfig(portal=portal.url, token=portal.add_node("node-c1"), name="node-c1", state_dir=closed / "agent")
    agent = Agent(replace(config, run_as_owner=True), SimulatedGpus(gpus_from_spec("1xH100", node="node-c1")))
    with pytest.raises(AgentFatal, match=re.escape(f"is mode 700; give it o+x (chmod o+x {closed})")):
        agent.run()


def test_run_as_owner_is_refused_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match="--run-as-owner needs the agent to run as root"):
        build_config(file_values={}, cli_values={"portal": "http://p", "token": "t", "run_as_owner": True})


def test_run_as_owner_in_the_config_file_must_be_a_boolean(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("run_as_owner = true\n")
    assert load_toml(path) == {"run_as_owner": True}
    path.write_text('run_as_owner = "yes"\n')
    with pytest.raises(ConfigError, match="run_as_owner must be true or false, not 'yes'"):
        load_toml(path)


@needs_root
def test_a_notebook_whose_python_owners_cannot_run_fails_with_the_fix(
    state_dir: Path, portal: FakePortal, start_agent: StartAgent, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hidden = tmp_path / "private"  # like a Python under /root (mode 0700)
    (hidden / "bin").mkdir(parents=True)
    hidden.chmod(0o700)
    python = hidden / "bin" / "python3"
    python.symlink_to(sys.executable)
    monkeypatch.setattr(sys, "executable", str(python))
    start_agent(run_as_owner=True, state_dir=state_dir)
    portal.set_desired("node-t1", [task_spec(44, "", kind="notebook", user="nobody")])
    status = _exited(portal, 44)
    assert status["exit_code"] is None and status["signal"] is None
    log = (state_dir / "tasks" / "44-1" / "output.log").read_text()
    assert f"a notebook runs this agent's Python ({python}) as its owner" in log
    assert "install the agent where every account can run it" in log


def test_closed_to_others_names_the_first_closed_folder(tmp_path: Path) -> None:
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    (tmp_path / "a").chmod(0o700)
    assert closed_to_others(inner) == tmp_path / "a"  # the nearest one (pytest's own tmp above is 0700 too)
    (tmp_path / "a").chmod(0o755)
    open_dir = Path(tempfile.mkdtemp())
    try:
        open_dir.chmod(0o711)
        assert closed_to_others(open_dir) is None
    finally:
        open_dir.rmdir()
