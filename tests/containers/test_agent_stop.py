"""Stopping a container task as a host task stops: SIGTERM reaches the workload (its checkpoint is on
the host), SIGKILL after the grace leaves no process, a killed wrapper takes its container along, the
watchdog fences a container whose agent is gone, and a restarted agent adopts a running container."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from nodeagent import launcher
from tests.containers.conftest import container_spec, needs_containers, runc_ids, wait_until
from tests.containers.test_agent_run import exited, log_of
from tests.nodeagent.conftest import RunningAgent
from tests.nodeagent.fakeportal import FakePortal

pytestmark = needs_containers
StartAgent = Callable[..., RunningAgent]

# Writes its checkpoint on SIGTERM and exits 0; says when it is ready.
CHECKPOINTING = (
    "trap 'echo saved-at-sigterm > $YARD_CHECKPOINT_DIR/state; exit 0' TERM; echo ready; while true; do sleep 0.2; done"
)
# Ignores SIGTERM (and so do its children), with two more processes in the container.
STUBBORN = "trap '' TERM; sleep 1000 & sleep 1000 & echo ready; while true; do sleep 0.2; done"


def processes_of(launch_id: str) -> list[int]:
    """Every live process whose environment carries the task's launch id: the container's included."""
    needle = f"YARD_LAUNCH_ID={launch_id}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if needle in Path(f"/proc/{entry.name}/environ").read_bytes().split(b"\0") and launcher.process_alive(
                    int(entry.name), None
                ):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def ready(portal: FakePortal, agent: RunningAgent, task_id: int) -> RunningAgent:
    wait_until(lambda: "ready" in log_of(portal, task_id) or "ready" in _local_log(agent, task_id), what=f"task {task_id} ready")
    return agent


def _local_log(agent: RunningAgent, task_id: int) -> str:
    record = agent.record(task_id)
    try:
        return record.log_path.read_text() if record else ""
    except OSError:
        return ""


def test_sigterm_reaches_the_workload_and_its_checkpoint_is_on_the_host(
    portal: FakePortal, start_ct_agent: StartAgent, image: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    agent = start_ct_agent()
    spec = container_spec(10, CHECKPOINTING, image, checkpoint_dir=str(ckpt), grace_s=20)
    portal.set_desired("node-t1", [spec])
    ready(portal, agent, 10)
    portal.set_desired("node-t1", [{**spec, "action": "stop", "stop_reason": "preempted"}])
    status = exited(portal, 10)
    assert (status["stopped_by"], status["stop_cause"], status["exit_code"]) == ("sigterm", "stop", 0)
    assert (ckpt / "state").read_text() == "saved-at-sigterm\n"
    assert status["checkpoint_time"] is not None


def test_sigkill_after_the_grace_leaves_no_process(portal: FakePortal, start_ct_agent: StartAgent, image: str) -> None:
    agent = start_ct_agent()
    spec = container_spec(11, STUBBORN, image, grace_s=1)
    portal.set_desired("node-t1", [spec])
    ready(portal, agent, 11)
    launch_id = agent.record(11).launch_id
    assert len(processes_of(launch_id)) >= 4  # sh, two sleeps, the loop's sleep: out of the wrapper's group
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    status = exited(portal, 11)
    assert (status["stopped_by"], status["signal"]) == ("sigkill", 9)
    assert processes_of(launch_id) == []
    assert runc_ids(agent.agent.state_dir) == []


def test_a_killed_wrapper_group_takes_its_container_along(portal: FakePortal, start_ct_agent: StartAgent, image: str) -> None:
    agent = start_ct_agent()
    portal.set_desired("node-t1", [container_spec(12, STUBBORN, image)])
    ready(portal, agent, 12)
    record = agent.record(12)
    inside = [p for p in processes_of(record.launch_id) if os.getpgid(p) != record.pid]
    assert inside, "the container's processes are in a session of their own"
    os.killpg(record.pid, signal.SIGKILL)  # runc and the wrapper only: the pid namespace is not in the group
    status = exited(portal, 12)
    assert status["signal"] == 9
    wait_until(lambda: processes_of(record.launch_id) == [], what="no process of the container left", timeout=10)
    assert runc_ids(agent.agent.state_dir) == []


def test_the_watchdog_fences_a_container_whose_agent_is_gone(
    portal: FakePortal, start_ct_agent: StartAgent, image: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    agent = start_ct_agent(fence_after_s=2.0, http_timeout_s=0.5)
    portal.set_desired("node-t1", [container_spec(13, CHECKPOINTING, image, checkpoint_dir=str(ckpt), grace_s=5)])
    ready(portal, agent, 13)
    record = agent.record(13)
    agent.stop()  # gone: the lease is no longer renewed, and nobody supervises the container
    wait_until(lambda: (ckpt / "state").exists(), what="the watchdog's SIGTERM checkpointing the workload", timeout=20)
    wait_until(lambda: processes_of(record.launch_id) == [], what="the fenced container gone", timeout=15)
    assert (Path(record.workdir) / "fenced").exists()


def test_a_restarted_agent_adopts_a_running_container(
    portal: FakePortal, start_ct_agent: StartAgent, image: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    first = start_ct_agent()
    spec = container_spec(14, CHECKPOINTING, image, checkpoint_dir=str(ckpt), grace_s=20)
    portal.set_desired("node-t1", [spec])
    ready(portal, first, 14)
    launch_id, pid = first.record(14).launch_id, first.record(14).pid
    first.stop()  # the workload keeps running, as it does when the agent is restarted
    second = start_ct_agent()
    wait_until(lambda: (r := second.record(14)) is not None and r.state == "running" and r.pid == pid, what="task 14 adopted")
    assert second.record(14).launch_id == launch_id and processes_of(launch_id)
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    status = exited(portal, 14)
    assert (status["stopped_by"], status["exit_code"]) == ("sigterm", 0)
    assert (ckpt / "state").read_text() == "saved-at-sigterm\n"
    assert processes_of(launch_id) == []


def test_a_time_limit_stops_a_container_with_sigterm_then_its_grace(
    portal: FakePortal, start_ct_agent: StartAgent, image: str, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    start_ct_agent()
    portal.set_desired("node-t1", [container_spec(15, CHECKPOINTING, image, checkpoint_dir=str(ckpt), time_limit_s=1)])
    status = exited(portal, 15)
    assert (status["stop_cause"], status["stopped_by"], status["exit_code"]) == ("time_limit", "sigterm", 0)
    assert (ckpt / "state").read_text() == "saved-at-sigterm\n"


def test_an_agent_removes_containers_its_journal_does_not_name(
    portal: FakePortal, start_ct_agent: StartAgent, image: str
) -> None:
    first = start_ct_agent()
    portal.set_desired("node-t1", [container_spec(16, STUBBORN, image)])
    ready(portal, first, 16)
    launch_id = first.record(16).launch_id
    first.stop()
    (first.agent.state_dir / "journal.json").unlink()  # moved away by an operator, say
    portal.set_desired("node-t1", [])
    second = start_ct_agent()
    bundles = second.agent.state_dir / "containers"
    wait_until(lambda: not list(bundles.iterdir()), what="the unknown container's bundle removed", timeout=20)
    assert processes_of(launch_id) == []
    assert runc_ids(second.agent.state_dir) == []


def test_sigterm_ends_a_workload_without_a_handler_at_once_not_after_its_grace(
    portal: FakePortal, start_ct_agent: StartAgent, image: str
) -> None:
    """As on the host: SIGTERM's default action, though the kernel shields a pid namespace's init."""
    agent = start_ct_agent()
    spec = container_spec(17, "echo ready; exec sleep 1000", image, grace_s=60)
    portal.set_desired("node-t1", [spec])
    ready(portal, agent, 17)
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    status = exited(portal, 17, timeout=20)
    assert (status["stopped_by"], status["signal"]) == ("sigterm", 15)
