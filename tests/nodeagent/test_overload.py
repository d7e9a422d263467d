"""An agent whose portal answers is not lost: a heartbeat shed with 503/429 "overloaded" (or answered
503 "unavailable") is an answer, and the workloads keep running however long it lasts; a portal that
is gone (refused connections, calls never answered) or a 503 that is not the portal's own still stops
them after stop_after_s. And the agent's timeouts must fit its fence (nodeagent/config.py).

Real agents, real workload processes, the fake portal on a real socket (tests/nodeagent/fakeportal.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent.agent import Agent, AgentFatal
from nodeagent.config import AgentConfig, ConfigError, build_config, with_portal_limits
from nodeagent.launcher import process_alive
from nodeagent.simgpu import SimulatedGpus, gpus_from_spec
from tests.nodeagent.conftest import RunningAgent, task_spec, wait_gone
from tests.nodeagent.fakeportal import ENROLMENT_TOKEN, FakePortal

StartAgent = Callable[..., RunningAgent]
STOP_AFTER_S = 1.5


def _running(portal: FakePortal, start_agent: StartAgent, task_id: int) -> tuple[RunningAgent, Any]:
    agent = start_agent(stop_after_s=STOP_AFTER_S)
    portal.set_desired("node-t1", [task_spec(task_id, "exec sleep 120")])
    record = portal.wait_for(lambda: agent.record(task_id), what=f"task {task_id} started")
    portal.wait_for(lambda: record.running_reported, what=f"task {task_id} reported")
    return agent, record


@pytest.mark.parametrize(
    ("status", "code"),
    [(503, "overloaded"), (429, "overloaded"), (503, "unavailable")],
    ids=["503-shed", "429-shed", "503-blind"],
)
def test_a_portal_that_sheds_every_heartbeat_for_long_past_stop_after_keeps_the_work_running(
    portal: FakePortal, start_agent: StartAgent, status: int, code: str
) -> None:
    agent, record = _running(portal, start_agent, 30)
    portal.shed(status, {"code": code, "message": "busy"}, retry_after="1")
    # Three times stop_after, and enough answers that the agent has surely judged its silence meanwhile.
    portal.wait_for(
        lambda: portal.shedding_for() > 3 * STOP_AFTER_S and portal.shed_count >= 8, timeout=30, what="a long shedding spell"
    )
    assert record.state == "running" and process_alive(record.pid, record.start_ticks)
    assert not agent.agent.link.lost and agent.agent.link.silence() < STOP_AFTER_S
    assert agent.agent.link.stats["heartbeat"].blind >= 3
    portal.shed(None)
    beats = len(portal.heartbeats("node-t1"))
    portal.wait_for(lambda: len(portal.heartbeats("node-t1")) > beats, what="heartbeats after the spell")
    assert record.state == "running" and process_alive(record.pid, record.start_ticks)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (503, {"detail": "<html>502 Bad Gateway</html>"}),
        (503, {"code": "unavailable_unrecorded"}),
        (429, {"detail": "slow down"}),
    ],
    ids=["load-balancer-503", "unrecorded-503", "plain-429"],
)
def test_an_answer_the_portal_did_not_record_as_blind_counts_as_silence(
    portal: FakePortal, start_agent: StartAgent, status: int, body: dict[str, Any]
) -> None:
    # The portal counts such a spell as the node's silence: the agent must stop its work in time.
    _agent, record = _running(portal, start_agent, 31)
    portal.shed(status, body)
    portal.wait_for(lambda: record.state == "exited", timeout=15, what="task 31 stopped by the agent")
    assert wait_gone(record.pid, timeout=5)
    assert record.stop_cause == "portal_unreachable"


def test_a_portal_that_takes_calls_and_never_answers_is_gone_and_the_work_stops(
    portal: FakePortal, start_agent: StartAgent
) -> None:
    agent = start_agent(stop_after_s=STOP_AFTER_S, http_timeout_s=0.3)
    portal.set_desired("node-t1", [task_spec(32, "exec sleep 120")])
    record = portal.wait_for(lambda: agent.record(32), what="task 32 started")
    portal.wait_for(lambda: record.running_reported, what="task 32 reported")
    portal.hang()
    portal.wait_for(lambda: record.state == "exited", timeout=15, what="task 32 stopped by the agent")
    assert wait_gone(record.pid, timeout=5)
    assert record.stop_cause == "portal_unreachable"
    assert agent.agent.link.stats["heartbeat"].unreachable >= 1


def test_the_agent_refuses_to_start_with_a_fence_shorter_than_one_slow_call(tmp_path: Path) -> None:
    # The fault runs' settings: heartbeat 3 s, fence-after 8 s, and the default 20 s HTTP timeout.
    args = ["--portal", "http://127.0.0.1:9", "--token", "ynd_x", "--simulate", "1xH100", "--state-dir", str(tmp_path)]
    args += ["--heartbeat-interval", "3", "--fence-after", "8"]
    done = subprocess.run([sys.executable, "-m", "nodeagent", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "fence_after_s=8 must be longer than http_timeout_s=20 + heartbeat_interval_s=3" in done.stderr
    assert "--fence-after" in done.stderr and "--http-timeout" in done.stderr
    assert not (tmp_path / "journal.json").exists()


def test_consistent_timeouts_are_accepted() -> None:
    values = {"portal": "http://p", "token": "t"}
    assert build_config(file_values={}, cli_values=values).fence_after_s == 60.0
    config = build_config(
        file_values={}, cli_values={**values, "heartbeat_interval_s": 3, "fence_after_s": 8, "http_timeout_s": 4}
    )
    assert config.http_timeout_s == 4
    with pytest.raises(ConfigError, match="fence_after_s=8 must be longer"):
        build_config(file_values={}, cli_values={**values, "heartbeat_interval_s": 3, "fence_after_s": 8, "http_timeout_s": 5})


def test_the_portals_short_fence_shortens_the_http_timeout_to_fit() -> None:
    config = AgentConfig(portal="http://p", token="t")
    fitted = with_portal_limits(config, heartbeat_interval_s=3, fence_after_s=8)
    assert (fitted.fence_after_s, fitted.http_timeout_s) == (8.0, 4.0)
    assert with_portal_limits(config, heartbeat_interval_s=5).http_timeout_s == config.http_timeout_s


def test_a_running_agent_adopts_the_portals_fence_with_a_timeout_that_fits(portal: FakePortal, start_agent: StartAgent) -> None:
    portal.limits = {"fence_after_s": 2.0}
    agent = start_agent()
    portal.wait_for(lambda: agent.agent.config.fence_after_s == 2.0, what="the portal's fence adopted")
    client = agent.agent.link.client
    assert client is not None and client.timeout_s == pytest.approx(0.8 * (2.0 - 0.3))


def test_the_agent_refuses_to_start_under_portal_limits_no_timeout_can_fit(portal: FakePortal, tmp_path: Path) -> None:
    state = tmp_path / "node-x"
    state.mkdir()
    (state / "node-token").write_text(portal.add_node("node-x") + "\n")
    (state / "node.json").write_text(json.dumps({"heartbeat_interval_s": 0.9, "fence_after_s": 1.2}))
    config = AgentConfig(portal=portal.url, token=ENROLMENT_TOKEN, name="node-x", state_dir=state)
    agent = Agent(config, SimulatedGpus(gpus_from_spec("1xH100", node="node-x")))
    with pytest.raises(AgentFatal, match="YARD_AGENT_FENCE_AFTER_S"):
        agent.run()


def test_a_fence_that_would_outlast_node_down_after_a_late_agent_loss_is_refused() -> None:
    # Silent for almost stop_after_s, then the agent dies: the watchdog fences fence_after_s later.
    values = {"portal": "http://p", "token": "t"}
    # 120 + 20.5 + 20 + 80 + 60 + 2 = 302.5 s, past the 300 s DOWN timeout; with 70 s it is 292.5 s.
    with pytest.raises(ConfigError, match=r"= 302\.5 s is too long"):
        build_config(file_values={}, cli_values={**values, "fence_after_s": 80})
    assert build_config(file_values={}, cli_values={**values, "fence_after_s": 70}).fence_after_s == 70


def test_the_watchdog_keeps_the_kill_an_agent_that_died_mid_stop_had_due(tmp_path: Path) -> None:
    # The agent sent SIGTERM (its own liveness tripped) and died before the SIGKILL it had due: the
    # watchdog must not start a whole new grace, or the work outlives the bound in docs/scale.md.
    import os
    import time

    from nodeagent import journal as journal_mod
    from nodeagent import launcher, watchdog
    from nodeagent.journal import JournalData, TaskRecord

    state = tmp_path / "node-w"
    state.mkdir()
    proc = subprocess.Popen(
        ["sh", "-c", "trap '' TERM; echo ready; exec sleep 120"], start_new_session=True, stdout=subprocess.PIPE
    )
    try:
        # Only once the shell has set its trap (on a loaded machine the SIGTERM below could come first);
        # sleep keeps the ignored SIGTERM across the exec.
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        now = time.time()
        record = TaskRecord(
            task_id=40, attempt=1, job_id=40, kind="batch", launch_id="l-40", workdir=str(tmp_path), checkpoint_dir=str(tmp_path),
            state="stopping", pid=proc.pid, start_ticks=launcher.start_ticks(proc.pid), grace_s=60.0,
            stop_cause="portal_unreachable", sigterm_at=now - 50, stop_deadline=now - 5,
        )  # fmt: skip
        journal_mod.save(state / "journal.json", JournalData(tasks=[record]))
        (state / watchdog.LEASE_FILE).write_text(json.dumps({"fence_after_s": 1.0, "max_grace_s": 60.0}))
        os.utime(state / watchdog.LEASE_FILE, (now - 30, now - 30))  # the agent died 30 s ago
        guard = watchdog.Watchdog(dirs=[state], root=None, clock=lambda: now)
        assert guard.poll()  # fences: SIGTERM (ignored), and the kill due now
        guard.poll()
        assert proc.wait(timeout=5) == -9
    finally:
        proc.kill()
        proc.wait()
