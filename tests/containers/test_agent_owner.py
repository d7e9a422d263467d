"""A container task as its owner (--run-as-owner) and within the cores it was given."""

from __future__ import annotations

import pwd
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.containers.conftest import container_spec, needs_containers
from tests.containers.test_agent_run import exited, log_of
from tests.nodeagent.conftest import RunningAgent
from tests.nodeagent.fakeportal import FakePortal

pytestmark = needs_containers
StartAgent = Callable[..., RunningAgent]
NOBODY = pwd.getpwnam("nobody")


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state directory task owners can reach (pytest's temporary folders are mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="yard-ct-owner-"))
    path.chmod(0o711)
    yield path / "agent"
    shutil.rmtree(path, ignore_errors=True)


def test_a_container_runs_as_its_owner_who_writes_its_run_and_checkpoint_dirs(
    state_dir: Path, portal: FakePortal, start_ct_agent: StartAgent, image: str
) -> None:
    running = start_ct_agent(run_as_owner=True, state_dir=state_dir)
    command = (
        "id -u; id -g; echo mine > $YARD_WORKDIR/out.txt; echo ck > $YARD_CHECKPOINT_DIR/c && echo ck-ok; "
        "touch /etc/x 2>&1 || echo root-is-not-mine"
    )
    portal.set_desired("node-t1", [container_spec(30, command, image, user="nobody")])
    assert exited(portal, 30)["exit_code"] == 0
    lines = log_of(portal, 30).split("\n")
    assert lines[:2] == [str(NOBODY.pw_uid), str(NOBODY.pw_gid)], lines
    record = running.record(30)
    assert (record.run_dir / "out.txt").stat().st_uid == NOBODY.pw_uid
    assert "ck-ok" in lines and "root-is-not-mine" in lines


def test_a_container_keeps_to_the_cores_its_task_was_given(portal: FakePortal, start_ct_agent: StartAgent, image: str) -> None:
    running = start_ct_agent()
    portal.set_desired("node-t1", [container_spec(31, "grep Cpus_allowed_list /proc/self/status", image, cpus=1)])
    assert exited(portal, 31)["exit_code"] == 0
    if running.agent.workloads.limiter.mode != "affinity":
        pytest.skip("this node holds tasks in cgroup v2 groups, not by affinity")
    allowed = log_of(portal, 31).split(":", 1)[1].strip()
    assert allowed.isdigit(), f"one core, not {allowed!r}"
