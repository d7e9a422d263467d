"""Launching, logs, exit reports, graceful stop, time limits and fencing: agents in threads, real
workload processes, the fake portal."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent import launcher
from nodeagent.config import MAX_GRACE_S
from tests.nodeagent.conftest import RunningAgent, task_spec, wait_gone
from tests.nodeagent.fakeportal import FakePortal

StartAgent = Callable[..., RunningAgent]


def exited_status(portal: FakePortal, task_id: int) -> dict[str, object]:
    statuses = portal.wait_for(lambda: portal.statuses_of(task_id, "exited"), what=f"task {task_id} exited")
    return statuses[-1]  # type: ignore[no-any-return]


def running_pid(portal: FakePortal, task_id: int) -> int:
    statuses = portal.wait_for(lambda: portal.statuses_of(task_id, "running"), what=f"task {task_id} running")
    return int(statuses[0]["pid"])


def test_task_env_has_gpus_torchrun_variables_and_yard_variables(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    env_file = tmp_path / "env.txt"
    start_agent()
    portal.set_desired(
        "node-t1",
        [
            task_spec(
                7,
                f"env > {env_file}",
                gpus=[4, 5, 6, 7],
                rank=1,
                node_rank=1,
                world_size=2,
                master_addr="10.0.0.9",
                master_port=29511,
                env={"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "WANDB_MODE": "offline"},
                checkpoint_dir=str(tmp_path / "ckpt" / "job-107"),
            )
        ],
    )
    exited_status(portal, 7)
    env = dict(line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    assert {
        k: env[k]
        for k in (
            "CUDA_VISIBLE_DEVICES",
            "WORLD_SIZE",
            "RANK",
            "NODE_RANK",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
            "YARD_JOB_ID",
            "YARD_TASK_ID",
            "YARD_ATTEMPT",
            "WANDB_MODE",
        )
    } == {
        "CUDA_VISIBLE_DEVICES": "4,5,6,7",
        "WORLD_SIZE": "2",
        "RANK": "1",
        "NODE_RANK": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "10.0.0.9",
        "MASTER_PORT": "29511",
        "YARD_JOB_ID": "107",
        "YARD_TASK_ID": "7",
        "YARD_ATTEMPT": "1",
        "WANDB_MODE": "offline",
    }
    assert env["YARD_CHECKPOINT_DIR"] == str(tmp_path / "ckpt" / "job-107")
    assert Path(env["YARD_CHECKPOINT_DIR"]).is_dir()
    assert env["YARD_SIM_UTIL_FILE"].endswith("sim-util")


def test_logs_are_shipped_and_the_exit_code_reported(portal: FakePortal, start_agent: StartAgent) -> None:
    start_agent()
    portal.set_desired("node-t1", [task_spec(8, "echo to stdout; echo to stderr >&2; printf 'naïve\\n'; exit 3")])
    status = exited_status(portal, 8)
    assert (status["exit_code"], status["signal"], status["stopped_by"], status["stop_cause"]) == (3, None, None, None)
    assert portal.log_text(8) == "to stdout\nto stderr\nnaïve\n"
    assert portal.statuses_of(8, "running")[0]["started_at"] is not None


def test_a_finished_task_is_not_started_again_while_still_desired(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    agent = start_agent()
    portal.set_desired("node-t1", [task_spec(9, f"echo run >> {runs}")])
    exited_status(portal, 9)
    heartbeats = len(portal.heartbeats("node-t1"))
    portal.wait_for(lambda: len(portal.heartbeats("node-t1")) > heartbeats + 3, what="more heartbeats")
    assert runs.read_text() == "run\n"
    assert agent.record(9).settled


def test_stop_sends_sigterm_and_a_trapping_workload_checkpoints_and_exits(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    script = "trap 'echo saved > \"$YARD_CHECKPOINT_DIR/step-10\"; exit 0' TERM; while :; do sleep 0.1; done"
    spec = task_spec(10, script, checkpoint_dir=str(ckpt), grace_s=20)
    start_agent()
    portal.set_desired("node-t1", [spec])
    pid = running_pid(portal, 10)
    portal.set_desired("node-t1", [{**spec, "action": "stop", "stop_reason": "preempted by job 913"}])
    status = exited_status(portal, 10)
    assert (status["stopped_by"], status["stop_cause"], status["exit_code"]) == ("sigterm", "stop", 0)
    assert (ckpt / "step-10").read_text() == "saved\n"
    assert wait_gone(pid, timeout=2)


def test_a_python_workload_trapping_sigterm_reports_its_own_exit_status(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    # The common case: `python train.py`, no `exec`. The shell between agent and workload must not
    # die of the SIGTERM first and hide the workload's clean exit behind status 143.
    trainer = tmp_path / "train.py"
    trainer.write_text(
        "import os, signal, sys, time\n"
        "def stop(*_):\n"
        "    open(os.path.join(os.environ['YARD_CHECKPOINT_DIR'], 'ckpt'), 'w').write('saved')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        "while True: time.sleep(0.1)\n"
    )
    ckpt = tmp_path / "ckpt-dir"
    spec = task_spec(12, f"{sys.executable} {trainer}", checkpoint_dir=str(ckpt), grace_s=20)
    start_agent()
    portal.set_desired("node-t1", [spec])
    running_pid(portal, 12)
    portal.set_desired("node-t1", [{**spec, "action": "stop", "stop_reason": "preempted"}])
    status = exited_status(portal, 12)
    assert (status["stopped_by"], status["exit_code"], status["signal"]) == ("sigterm", 0, None)
    assert (ckpt / "ckpt").read_text() == "saved"


def test_a_workload_ignoring_sigterm_is_killed_when_the_grace_ends(portal: FakePortal, start_agent: StartAgent) -> None:
    spec = task_spec(11, "trap '' TERM; while :; do sleep 0.1; done", grace_s=1)
    start_agent()
    portal.set_desired("node-t1", [spec])
    pid = running_pid(portal, 11)
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    status = exited_status(portal, 11)
    assert (status["stopped_by"], status["signal"]) == ("sigkill", 9)
    assert status["ended_at"] - status["started_at"] >= 1  # type: ignore[operator]
    assert wait_gone(pid, timeout=2)


def test_an_ordered_grace_longer_than_a_minute_is_given_in_full(portal: FakePortal, start_agent: StartAgent) -> None:
    agent = start_agent()
    spec = task_spec(14, "trap '' TERM; while :; do sleep 0.1; done", grace_s=600)
    portal.set_desired("node-t1", [spec])
    running_pid(portal, 14)
    portal.set_desired("node-t1", [{**spec, "action": "stop", "grace_s": 600}])
    record = portal.wait_for(lambda: (r := agent.record(14)) and r.state == "stopping" and r, what="task 14 stopping")
    assert record.stop_deadline - record.sigterm_at == 600


def test_losing_the_portal_mid_stop_cuts_a_long_grace_to_the_liveness_bound(portal: FakePortal, start_agent: StartAgent) -> None:
    agent = start_agent(stop_after_s=1.0)
    spec = task_spec(15, "trap '' TERM; while :; do sleep 0.1; done", grace_s=600)
    portal.set_desired("node-t1", [spec])
    running_pid(portal, 15)
    portal.set_desired("node-t1", [{**spec, "action": "stop", "grace_s": 600}])
    record = portal.wait_for(lambda: (r := agent.record(15)) and r.state == "stopping" and r, what="task 15 stopping")
    portal.stop()
    portal.wait_for(lambda: record.stop_deadline - record.sigterm_at < 600, timeout=10, what="the grace cut short")
    assert record.stop_deadline - agent.agent.clock() <= MAX_GRACE_S
    assert record.stop_cause == "stop"  # still the portal's stop, only sooner


def test_processes_the_workload_forked_die_with_it(portal: FakePortal, start_agent: StartAgent, tmp_path: Path) -> None:
    start_agent()
    portal.set_desired("node-t1", [task_spec(12, "sleep 60 & echo $! > child; exit 0")])
    exited_status(portal, 12)
    workdir = tmp_path / "node-t1" / "tasks" / "12-1"
    child = int((workdir / "child").read_text())
    assert wait_gone(child, timeout=5) or not Path(f"/proc/{child}").exists()


def test_time_limit_stops_the_task_gracefully(portal: FakePortal, start_agent: StartAgent) -> None:
    start_agent()
    portal.set_desired("node-t1", [task_spec(13, "exec sleep 60", time_limit_s=1, grace_s=5)])
    status = exited_status(portal, 13)
    assert (status["stop_cause"], status["stopped_by"], status["signal"]) == ("time_limit", "sigterm", 15)


def test_fencing_kills_a_task_missing_from_desired(portal: FakePortal, start_agent: StartAgent) -> None:
    start_agent(fence_grace_s=1.0)
    portal.set_desired("node-t1", [task_spec(14, "trap '' TERM; exec sleep 60")])
    pid = running_pid(portal, 14)
    portal.set_desired("node-t1", [])
    status = exited_status(portal, 14)
    assert (status["stop_cause"], status["stopped_by"]) == ("fenced", "sigkill")
    assert wait_gone(pid, timeout=2)


def test_a_stale_attempt_is_fenced_and_its_end_refused(portal: FakePortal, start_agent: StartAgent) -> None:
    agent = start_agent()
    portal.set_desired("node-t1", [task_spec(15, "exec sleep 60")])
    record = portal.wait_for(lambda: agent.record(15), what="task 15 started")
    portal.wait_for(lambda: record.running_reported, what="task 15's start recorded")
    # The portal requeued it elsewhere: it leaves desired, and its end is answered 409.
    portal.stale.add((15, 1))
    portal.wait_for(lambda: record.settled, what="task 15 settled")
    assert portal.statuses_of(15, "exited") == []
    assert (record.stop_cause, record.signal) == ("fenced", 15)
    assert wait_gone(record.pid, timeout=2)


def test_heartbeat_reports_simulated_utilisation_from_the_workload(portal: FakePortal, start_agent: StartAgent) -> None:
    start_agent()
    portal.set_desired("node-t1", [task_spec(16, 'echo 88 > "$YARD_SIM_UTIL_FILE"; exec sleep 60', gpus=[2, 3])])

    def utilisation() -> list[float] | None:
        # Readings go out when they move (or once a minute), not in every heartbeat: take the newest.
        beats = [b for b in portal.heartbeats("node-t1") if b["gpus"]]
        if not beats:
            return None
        utils = [g["utilization_pct"] for g in beats[-1]["gpus"]]
        return utils if utils[2] else None

    assert portal.wait_for(utilisation, what="utilisation") == [0.0, 0.0, 88.0, 88.0, 0.0, 0.0, 0.0, 0.0]


def test_heartbeat_reports_the_newest_checkpoint_time(portal: FakePortal, start_agent: StartAgent, tmp_path: Path) -> None:
    start_agent()
    portal.set_desired(
        "node-t1", [task_spec(17, 'touch "$YARD_CHECKPOINT_DIR/ckpt"; exec sleep 60', checkpoint_dir=str(tmp_path / "c17"))]
    )

    def checkpoint_time() -> float | None:
        for heartbeat in reversed(portal.heartbeats("node-t1")):
            for task in heartbeat["tasks"]:
                if task["checkpoint_time"]:
                    return float(task["checkpoint_time"])
        return None

    assert abs(portal.wait_for(checkpoint_time, what="checkpoint time") - os.stat(tmp_path / "c17" / "ckpt").st_mtime) < 1


def test_a_task_naming_gpus_the_node_lacks_fails_with_the_reason_in_its_log(portal: FakePortal, start_agent: StartAgent) -> None:
    start_agent()
    portal.set_desired("node-t1", [task_spec(18, "exit 0", gpus=[7, 8])])
    status = exited_status(portal, 18)
    assert (status["exit_code"], status["pid"]) == (None, None)
    assert "no GPU [8]" in portal.log_text(18)


def test_a_task_surviving_sigkill_drains_the_node(
    portal: FakePortal, start_agent: StartAgent, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No process survives SIGKILL on demand (that takes a hung driver, D state): here SIGKILL is
    # withheld from a workload that ignores SIGTERM, which looks the same to the agent.
    real_signal_group = launcher.signal_group
    monkeypatch.setattr(
        launcher, "signal_group", lambda pgid, signum: None if signum == signal.SIGKILL else real_signal_group(pgid, signum)
    )
    agent = start_agent(unkillable_after_s=0.5)
    spec = task_spec(19, "trap '' TERM; exec sleep 60", grace_s=0.2)
    portal.set_desired("node-t1", [spec])
    record = portal.wait_for(lambda: agent.record(19), what="task 19 started")
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    reason = portal.wait_for(lambda: portal.nodes["node-t1"].drains, what="a drain request")[0]
    assert reason.startswith("task 19 attempt 1") and "survived SIGKILL" in reason
    portal.wait_for(lambda: portal.heartbeats("node-t1")[-1]["draining_reason"], what="draining_reason in a heartbeat")
    assert record.state == "stopping"
