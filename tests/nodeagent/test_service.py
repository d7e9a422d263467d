"""Service replicas on the node (docs/services.md, "On the node"): $PORT, rank 0's HTTP probes, restarts in
place with a back-off, crash-looping, and the heartbeat's `service` report. Agents in threads, real HTTP
servers as the workloads, the fake portal."""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nodeagent import launcher
from nodeagent.service import CRASH_LOOP_AFTER, STREAK_RESET_S, ProbeSpec, ServiceInfo, report, service_url
from scheduling.agent.protocol import SERVICE, validate
from tests.containers.conftest import image, needs_containers, registry, runc_ids, start_ct_agent  # noqa: F401
from tests.nodeagent.conftest import RunningAgent, task_spec
from tests.nodeagent.fakeportal import FakePortal

StartAgent = Callable[..., RunningAgent]

# A tiny real server: it writes its pid and the port variables into a file (one line per start), answers
# 200 on /health and 500 anywhere else.
SERVER = """
import http.server, json, os, sys
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({k: os.environ.get(k) for k in ("PORT", "YARD_SERVICE_PORT", "CUDA_VISIBLE_DEVICES")}
                       | {"pid": os.getpid()}) + "\\n")
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if self.path == "/health" else 500
        self.send_response(code)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
"""


def server_command(tmp_path: Path, name: str = "starts") -> tuple[str, Path]:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    starts = tmp_path / f"{name}.jsonl"
    return f"{sys.executable} {script} {starts}", starts


def starts_of(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def service_spec(task_id: int, command: str, *, port: int, **probe: Any) -> dict[str, Any]:
    """A service replica's desired entry, as scheduling/agent/services/desired.py sends it (fast probes)."""
    service = {
        "service_id": 7,
        "revision": 1,
        "readiness_path": "/health",
        "liveness_path": None,
        "period_s": 0.1,
        "timeout_s": 1.0,
        "failure_threshold": 2,
        "success_threshold": 1,
        "initial_delay_s": 0.0,
        "backoff_max_s": 300.0,
        **probe,
    }
    return task_spec(task_id, command, kind="service", master_port=port, gpus=[task_id % 8], service=service)


def reported(portal: FakePortal, task_id: int, node: str = "node-t1", since: int = 0) -> dict[str, Any] | None:
    """The `service` object of the newest heartbeat (from the `since`-th on) that reports the task, checked
    against the portal's schema."""
    for heartbeat in reversed(portal.heartbeats(node)[since:]):
        for task in heartbeat["tasks"]:
            if task["task_id"] == task_id:
                service = task.get("service")
                return None if service is None else validate(SERVICE, service)  # raises if the portal would refuse it
    return None


def wait_report(
    portal: FakePortal,
    task_id: int,
    predicate: Callable[[dict[str, Any]], bool],
    what: str,
    timeout: float = 15.0,
    since: int = 0,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        service = reported(portal, task_id, since=since)
        return service if service is not None and predicate(service) else None

    return portal.wait_for(check, timeout=timeout, what=what)  # type: ignore[no-any-return]


def exited(portal: FakePortal, task_id: int, timeout: float = 15.0) -> dict[str, Any]:
    return portal.wait_for(lambda: portal.statuses_of(task_id, "exited"), timeout=timeout, what=f"task {task_id} exited")[-1]  # type: ignore[no-any-return]


def test_a_ready_server_is_reported_with_its_url_and_port_and_restarted_in_place_when_killed(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    port = launcher.free_port("127.0.0.1")
    command, starts = server_command(tmp_path)
    agent = start_agent()
    portal.set_desired("node-t1", [service_spec(3, command, port=port)])
    ready = wait_report(portal, 3, lambda s: s["ready"], "the server ready")
    assert ready["url"] == f"http://127.0.0.1:{port}"
    assert (ready["restarts"], ready["crash_looping"], ready["live"], ready["last_exit_code"]) == (0, False, None, None)
    first = starts_of(starts)
    assert first == [{"PORT": str(port), "YARD_SERVICE_PORT": str(port), "CUDA_VISIBLE_DEVICES": "3", "pid": first[0]["pid"]}]
    record = agent.record(3)
    wrapper, launch_id, started_at = record.pid, record.launch_id, record.started_at

    os.kill(first[0]["pid"], signal.SIGKILL)  # the server itself, not the agent's wrapper
    again = wait_report(portal, 3, lambda s: s["restarts"] == 1 and s["ready"], "the server restarted and ready again")
    assert (again["last_exit_code"], again["crash_looping"]) == (-signal.SIGKILL, False)
    assert again["message"] == "restart 1 after exit code -9; next back-off 1 s"  # ready again, its last restart still said
    assert again["last_restart_at"] is not None
    second = starts_of(starts)
    assert len(second) == 2 and second[1]["pid"] != first[0]["pid"]
    assert second[1] | {"pid": 0} == first[0] | {"pid": 0}  # same port, same GPUs
    portal.wait_for(
        lambda: "yard-agent: restart 1 after exit code -9; next back-off 1 s\n" in portal.log_text(3),
        what="the restart in the log",
    )
    # A fresh process, journaled (the watchdog fences the new one; a restarted agent adopts it) …
    record = agent.record(3)
    assert record.state == "running" and record.pid not in (None, wrapper) and record.launch_id != launch_id
    journaled = next(t for t in json.loads((tmp_path / "node-t1" / "journal.json").read_text())["tasks"] if t["task_id"] == 3)
    assert (journaled["pid"], journaled["start_ticks"], journaled["launch_id"]) == (
        record.pid,
        record.start_ticks,
        record.launch_id,
    )
    assert journaled["service"]["restarts"] == 1
    # … of the same task: the portal was never told it ended, and it keeps its first start.
    assert record.started_at == started_at and not portal.statuses_of(3, "exited")


def test_a_command_that_exits_at_once_crash_loops_with_a_growing_capped_back_off(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    start_agent()
    portal.set_desired(
        "node-t1", [service_spec(4, f"date +%s.%N >> {starts}; exit 3", port=launcher.free_port("127.0.0.1"), backoff_max_s=2.0)]
    )
    looping = wait_report(portal, 4, lambda s: s["crash_looping"], "crash-looping")
    assert looping["restarts"] >= CRASH_LOOP_AFTER and looping["last_exit_code"] == 3 and not looping["ready"]
    portal.wait_for(lambda: len(starts.read_text().split()) >= 4, what="a fourth start")
    times = [float(t) for t in starts.read_text().split()]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # 1 s, then 2 s, then 2 s again (the spec's backoff_max_s), each measured from a crash a moment after its start.
    assert 1.0 <= gaps[0] < 1.9 and 2.0 <= gaps[1] < 3.5 and 2.0 <= gaps[2] < 3.5, gaps
    log = portal.wait_for(
        lambda: "restart 3 after" in portal.log_text(4) and portal.log_text(4), what="three restarts in the log"
    )
    assert "yard-agent: restart 1 after exit code 3; next back-off 1 s\n" in log
    assert "yard-agent: restart 2 after exit code 3; next back-off 2 s\n" in log
    assert "yard-agent: restart 3 after exit code 3; next back-off 2 s\n" in log
    assert not portal.statuses_of(4, "exited")  # it keeps being restarted


def test_a_failing_liveness_probe_kills_the_server_and_it_is_restarted(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    command, starts = server_command(tmp_path)
    start_agent()
    # Liveness counts once the server has been ready (/health answers): then /sick's HTTP 500 kills it.
    spec = service_spec(5, command, port=launcher.free_port("127.0.0.1"), liveness_path="/sick")
    portal.set_desired("node-t1", [spec])
    restarted = wait_report(portal, 5, lambda s: s["restarts"] >= 1, "a restart after the liveness probe failed")
    assert restarted["last_exit_code"] == -signal.SIGKILL
    portal.wait_for(lambda: len(starts_of(starts)) >= 2, what="the server started again")
    log = portal.wait_for(lambda: "restart 1 after" in portal.log_text(5) and portal.log_text(5), what="the restart in the log")
    assert "yard-agent: liveness probe failed 2 times in a row (GET /sick: HTTP 500): killing the server" in log
    assert "yard-agent: restart 1 after exit code -9; next back-off 1 s\n" in log
    first = starts_of(starts)[0]["pid"]
    assert not launcher.process_alive(first, None)


def test_a_server_slow_to_start_is_not_killed_by_its_liveness_probe_before_it_is_ready(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    """A model server loading its weights answers nothing for a while: its liveness probe (which would
    fail twice in 0.2 s) counts only from its first ready answer, so it is never killed while it loads."""
    command, starts = server_command(tmp_path)
    start_agent()
    spec = service_spec(9, f"sleep 2; exec {command}", port=launcher.free_port("127.0.0.1"), liveness_path="/health")
    portal.set_desired("node-t1", [spec])
    ready = wait_report(portal, 9, lambda s: s["ready"], "the slow server ready")
    assert ready["restarts"] == 0 and ready["live"] is not False
    assert len(starts_of(starts)) == 1


def test_a_stop_order_during_the_back_off_ends_the_task_and_nothing_is_started_again(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    spec = service_spec(6, f"date +%s.%N >> {starts}; exit 1", port=launcher.free_port("127.0.0.1"), backoff_max_s=60.0)
    agent = start_agent()
    portal.set_desired("node-t1", [spec])
    # The second crash: a back-off of 2 s, the stop comes within a heartbeat (0.3 s).
    portal.wait_for(lambda: (r := agent.record(6)) is not None and r.service.restarts == 2, what="the second crash")
    portal.set_desired("node-t1", [{**spec, "action": "stop", "stop_reason": "scaled down"}])
    status = exited(portal, 6)
    # Ended as stopped, at once: no SIGTERM (no process ran), no exit code of its own.
    assert (status["stop_cause"], status["stopped_by"], status["exit_code"]) == ("stop", None, None)
    ended = agent.record(6)
    assert ended.service.restart_at is None
    time.sleep(max(0.0, ended.ended_at + 2.5 - time.time()))  # past the back-off's end
    assert len(starts.read_text().split()) == 2


def test_a_stop_order_to_a_running_server_stops_it_for_good(portal: FakePortal, start_agent: StartAgent, tmp_path: Path) -> None:
    command, starts = server_command(tmp_path)
    spec = service_spec(2, command, port=launcher.free_port("127.0.0.1"))
    agent = start_agent()
    portal.set_desired("node-t1", [spec])
    wait_report(portal, 2, lambda s: s["ready"], "the server ready")
    portal.set_desired("node-t1", [{**spec, "action": "stop", "stop_reason": "rollout"}])
    status = exited(portal, 2)
    assert (status["stop_cause"], status["stopped_by"]) == ("stop", "sigterm")
    assert agent.record(2).service.restarts == 0
    final = agent.agent.workloads.service_report(agent.record(2))  # what any later heartbeat would say
    assert final is not None and not final["ready"]
    time.sleep(1.2)  # a restart would have come after 1 s
    assert len(starts_of(starts)) == 1


def test_one_replica_crashing_never_touches_another_on_the_same_node(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    command, starts = server_command(tmp_path)
    agent = start_agent()
    portal.set_desired(
        "node-t1",
        [
            service_spec(1, command, port=launcher.free_port("127.0.0.1")),
            service_spec(2, "exit 4", port=launcher.free_port("127.0.0.1")),
        ],
    )
    wait_report(portal, 2, lambda s: s["restarts"] >= 2, "the crashing replica restarted twice")
    healthy = wait_report(portal, 1, lambda s: s["ready"], "the healthy replica ready")
    assert (healthy["restarts"], healthy["last_exit_code"], healthy["crash_looping"]) == (0, None, False)
    assert len(starts_of(starts)) == 1
    assert launcher.process_alive(starts_of(starts)[0]["pid"], None) and agent.record(1).service.restarts == 0
    assert "restart" not in portal.log_text(1)


def test_a_restarted_agent_adopts_the_restarted_server_and_keeps_counting(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    command, starts = server_command(tmp_path)
    agent = start_agent()
    portal.set_desired("node-t1", [service_spec(3, command, port=launcher.free_port("127.0.0.1"))])
    wait_report(portal, 3, lambda s: s["ready"], "the server ready")
    os.kill(starts_of(starts)[0]["pid"], signal.SIGKILL)
    portal.wait_for(lambda: agent.record(3).service.restarts == 1 and agent.record(3).pid, what="the restart")
    pid = agent.record(3).pid
    agent.stop()
    beats = len(portal.heartbeats("node-t1"))

    again = start_agent()
    portal.wait_for(lambda: again.record(3) is not None and again.record(3).pid == pid, what="the restarted server adopted")
    # Probed by the new agent: said in its own heartbeats.
    wait_report(portal, 3, lambda s: s["ready"] and s["restarts"] == 1, "the adopted server probed ready", since=beats)
    os.kill(starts_of(starts)[1]["pid"], signal.SIGKILL)
    wait_report(portal, 3, lambda s: s["ready"] and s["restarts"] == 2, "restarted again, by the new agent")
    assert len(starts_of(starts)) == 3 and not portal.statuses_of(3, "exited")


# -- the arithmetic, without processes ----------------------------------------------------------------


def _info(**probe: Any) -> ServiceInfo:
    return ServiceInfo(port=8000, url="http://10.0.0.1:8000", rank=0, probe=probe, spec={})


def test_the_back_off_doubles_per_crash_in_a_row_up_to_its_cap_and_resets_after_a_long_run() -> None:
    info = _info(backoff_max_s=5.0)
    backoffs = []
    for now in (0.0, 10.0, 20.0, 30.0, 40.0):
        info.run_started_at = now - 1.0
        info.crashed(now=now, exit_code=1, ever_ready=False)
        backoffs.append(info.backoff_s)
    assert backoffs == [1.0, 2.0, 4.0, 5.0, 5.0]
    info.run_started_at = 100.0
    line = info.crashed(now=100.0 + STREAK_RESET_S, exit_code=137, ever_ready=False)
    assert line == "restart 6 after exit code 137; next back-off 1 s"
    assert (info.backoff_s, info.restart_at, info.restarts) == (1.0, 161.0, 6)


def test_crash_looping_needs_three_crashes_without_becoming_ready() -> None:
    info = _info()
    for _ in range(CRASH_LOOP_AFTER - 1):
        info.crashed(now=0.0, exit_code=1, ever_ready=False)
    assert not info.crash_looping
    info.crashed(now=0.0, exit_code=1, ever_ready=True)  # it had become ready before this crash
    assert info.crashes_since_ready == 1 and not info.crash_looping
    info.crashed(now=0.0, exit_code=1, ever_ready=False)
    info.crashed(now=0.0, exit_code=1, ever_ready=False)
    assert info.crash_looping


def test_the_report_keeps_to_the_portals_bounds() -> None:
    info = _info()
    info.message = "x" * 5000
    info.crashed(now=0.0, exit_code=-300, ever_ready=False)
    info.message = "y" * 5000
    sent = validate(SERVICE, report(info, None, running=False))
    assert len(sent["message"]) == 1000 and sent["last_exit_code"] == -255 and sent["ready"] is False
    worker = ServiceInfo(port=8000, url="http://10.0.0.2:8000", rank=1, probe={}, spec={})
    assert validate(SERVICE, report(worker, None, running=True))["url"] is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, ProbeSpec()),
        (
            {"readiness_path": "health", "period_s": -1, "failure_threshold": 0, "timeout_s": float("nan")},
            ProbeSpec(readiness_path="/health", period_s=0.05, failure_threshold=1),
        ),
        ({"liveness_path": "", "backoff_max_s": True}, ProbeSpec()),
    ],
)
def test_a_probe_spec_the_agent_cannot_use_is_bounded_not_fatal(raw: dict[str, Any], expected: ProbeSpec) -> None:
    assert ProbeSpec.from_spec(raw) == expected


def test_the_url_puts_an_ipv6_address_in_brackets() -> None:
    assert service_url("fd00::7", 8000) == "http://[fd00::7]:8000"
    assert service_url("10.0.0.1", 8000) == "http://10.0.0.1:8000"
    assert service_url("10.0.0.1", 0) is None


# -- in a container (runc, a real registry: tests/containers/conftest.py; skipped without them) ------------


@needs_containers
def test_a_service_in_a_container_is_restarted_in_a_fresh_container_from_the_cached_image(
    portal: FakePortal,
    start_ct_agent: StartAgent,  # noqa: F811
    image: str,  # noqa: F811
) -> None:
    # The first start crashes; the second serves (sleeps) until stopped.
    command = (
        'echo "$PORT $YARD_SERVICE_PORT" >> "$YARD_WORKDIR/starts"; '
        'if [ -e "$YARD_WORKDIR/once" ]; then sleep 1000; else touch "$YARD_WORKDIR/once"; exit 3; fi'
    )
    port = launcher.free_port("127.0.0.1")
    spec = service_spec(7, command, port=port)
    spec["container"] = {"image": image, "mounts": [], "workdir": None, "auth": None}
    running = start_ct_agent()
    portal.set_desired("node-t1", [spec])
    portal.wait_for(
        lambda: (r := running.record(7)) is not None and r.container and r.container.get("id"), timeout=60, what="a container"
    )
    first = running.record(7).container["id"]
    portal.wait_for(
        lambda: (r := running.record(7)).service.restarts == 1 and r.pid and (r.container or {}).get("id") not in (None, first),
        timeout=30,
        what="the service restarted in a new container",
    )
    record = running.record(7)
    assert record.state == "running" and record.container["id"] == f"yard-{record.launch_id}"
    # Only the new container: the crashed one was removed.
    portal.wait_for(lambda: runc_ids(running.agent.state_dir) == [record.container["id"]], what="the new container alone")
    starts = (Path(record.workdir) / "starts").read_text().splitlines()
    assert starts == [f"{port} {port}", f"{port} {port}"]
    portal.wait_for(
        lambda: "yard-agent: restart 1 after exit code 3; next back-off 1 s\n" in portal.log_text(7),
        what="the restart in the log",
    )
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    assert exited(portal, 7, timeout=30)["stop_cause"] == "stop"
    assert running.agent.records[(7, 1)].service.restarts == 1


def test_an_agent_back_after_its_portal_gave_up_on_it_does_not_restart_a_crashed_service(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    starts = tmp_path / "starts"
    agent = start_agent(stop_after_s=1.5)
    portal.set_desired("node-t1", [service_spec(8, f"date +%s.%N >> {starts}; exit 1", port=launcher.free_port("127.0.0.1"))])
    portal.wait_for(lambda: (r := agent.record(8)) is not None and r.service.restarts == 1, what="the first crash")
    agent.stop()  # within its back-off: the journal says it waits to be started again
    portal.stop()
    time.sleep(2.0)  # past stop_after_s without a heartbeat: the portal may have given the replica up
    again = start_agent(stop_after_s=1.5)
    ended = portal.wait_for(lambda: (r := again.record(8)) is not None and r.state == "exited" and r, what="the replica ended")
    assert ended.stop_cause == "portal_unreachable" and len(starts.read_text().split()) == 1
    portal.start()
    assert exited(portal, 8)["stop_cause"] == "portal_unreachable"
    assert len(starts.read_text().split()) == 1
