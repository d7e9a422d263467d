"""Registration, losing the portal, and notebooks: agents in threads against the fake portal."""

from __future__ import annotations

import asyncio
import json
import stat
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from nodeagent.agent import Agent, AgentFatal
from nodeagent.config import AgentConfig
from nodeagent.launcher import process_alive
from nodeagent.simgpu import SimulatedGpus, gpus_from_spec
from tests.nodeagent.conftest import RunningAgent, task_spec, wait_gone
from tests.nodeagent.fakeportal import ENROLMENT_TOKEN, FakePortal

StartAgent = Callable[..., RunningAgent]


def test_enrolment_registers_the_node_with_its_gpus_and_saves_a_private_node_token(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    start_agent("node-e1", token=ENROLMENT_TOKEN, leaf="leaf-3", spine="spine-1")
    portal.wait_for(lambda: portal.heartbeats("node-e1"), what="a heartbeat")
    registration = portal.nodes["node-e1"].registration
    assert (registration["leaf"], registration["spine"], registration["simulated"]) == ("leaf-3", "spine-1", True)
    assert [g["index"] for g in registration["gpus"]] == list(range(8))
    token_file = tmp_path / "node-e1" / "node-token"
    assert token_file.read_text().strip() == portal.nodes["node-e1"].token
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600


def test_a_restarted_agent_reuses_its_saved_node_token(portal: FakePortal, start_agent: StartAgent) -> None:
    first = start_agent("node-e2", token=ENROLMENT_TOKEN)
    portal.wait_for(lambda: portal.heartbeats("node-e2"), what="a heartbeat")
    first.stop()
    beats = len(portal.heartbeats("node-e2"))
    second = start_agent("node-e2", token=ENROLMENT_TOKEN)
    portal.wait_for(lambda: len(portal.heartbeats("node-e2")) > beats, what="heartbeats after the restart")
    assert second.thread.is_alive()


def test_enrolling_a_name_already_registered_is_refused_plainly(portal: FakePortal, tmp_path: Path) -> None:
    portal.add_node("node-e3")
    config = AgentConfig(portal=portal.url, token=ENROLMENT_TOKEN, name="node-e3", state_dir=tmp_path / "e3")
    agent = Agent(config, SimulatedGpus(gpus_from_spec("1xH100", node="node-e3")))
    with pytest.raises(AgentFatal, match="registered already"):
        agent.run()


def test_a_short_portal_outage_leaves_workloads_running(portal: FakePortal, start_agent: StartAgent) -> None:
    agent = start_agent(stop_after_s=30.0)
    portal.set_desired("node-t1", [task_spec(20, "exec sleep 60")])
    record = portal.wait_for(lambda: agent.record(20), what="task 20 started")
    portal.wait_for(lambda: record.running_reported, what="task 20 reported")
    portal.stop()
    time.sleep(1.5)
    assert record.state == "running" and process_alive(record.pid, record.start_ticks)
    portal.start()
    beats = len(portal.heartbeats("node-t1"))
    portal.wait_for(lambda: len(portal.heartbeats("node-t1")) > beats, what="heartbeats after the outage")
    assert record.state == "running"


def test_past_stop_after_the_agent_stops_its_workloads_and_reports_them_later(
    portal: FakePortal, start_agent: StartAgent
) -> None:
    agent = start_agent(stop_after_s=1.5)
    spec = task_spec(21, "exec sleep 60")
    portal.set_desired("node-t1", [spec])
    record = portal.wait_for(lambda: agent.record(21), what="task 21 started")
    portal.wait_for(lambda: record.running_reported, what="task 21 reported")
    portal.stop()
    portal.wait_for(lambda: record.state == "exited", timeout=10, what="task 21 stopped by the agent")
    assert wait_gone(record.pid, timeout=2)
    portal.start()
    status = portal.wait_for(lambda: portal.statuses_of(21, "exited"), what="the exit report")[-1]
    assert (status["stop_cause"], status["stopped_by"]) == ("portal_unreachable", "sigterm")
    assert len(portal.statuses_of(21, "running")) == 1  # still desired with "run", yet never restarted


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def test_a_notebook_runs_jupyter_with_a_token_and_reports_its_activity(portal: FakePortal, start_agent: StartAgent) -> None:
    start_agent()
    spec = task_spec(22, "", kind="notebook", env={"YARD_NOTEBOOK_BASE_URL": "/nb/22"}, grace_s=10)
    portal.set_desired("node-t1", [spec])
    running = portal.wait_for(lambda: portal.statuses_of(22, "running"), what="notebook started")[0]
    url = running["notebook_url"]
    assert url.startswith("http://127.0.0.1:") and "/nb/22/?token=" in url
    api_status = url.replace("/?token=", "/api/status?token=")

    def answers() -> object:
        try:
            return _get_json(api_status)
        except OSError:
            return None

    assert "kernels" in portal.wait_for(answers, timeout=60, what="jupyter /api/status")  # type: ignore[operator]

    def reported_activity() -> dict[str, object] | None:
        for beat in reversed(portal.heartbeats("node-t1")):
            for task in beat["tasks"]:
                if task["task_id"] == 22 and task["notebook"] and task["notebook"]["kernels"] is not None:
                    return task["notebook"]  # type: ignore[no-any-return]
        return None

    notebook = portal.wait_for(reported_activity, what="notebook activity in a heartbeat")
    assert (notebook["url"], notebook["kernels"], notebook["kernel_busy"]) == (url, 0, False)
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    exited = portal.wait_for(lambda: portal.statuses_of(22, "exited"), timeout=20, what="notebook stopped")[-1]
    assert exited["stopped_by"] == "sigterm"
    assert wait_gone(int(running["pid"]), timeout=2)


def _execute_over_websocket(base: str, token: str, kernel_id: str, code: str) -> None:
    """Send one execute_request on the kernel's websocket, as JupyterLab in a browser does, and return
    once the kernel has gone busy on it (the connection closes; the code runs on)."""
    from tornado.websocket import websocket_connect

    async def run() -> None:
        url = base.replace("http://", "ws://") + f"api/kernels/{kernel_id}/channels?token={token}"
        connection = await websocket_connect(url)
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "username": "test",
            "session": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "version": "5.3",
        }
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell", "buffers": []}
        await connection.write_message(json.dumps(message))
        while True:
            reply = await asyncio.wait_for(connection.read_message(), timeout=30)
            assert reply is not None, "the kernel's websocket closed"
            body = json.loads(reply)
            if body.get("parent_header", {}).get("msg_id") == msg_id and body["content"].get("execution_state") == "busy":
                connection.close()
                return

    # In its own thread: in the whole suite Playwright's sync API may hold this thread's event loop.
    failure: list[BaseException] = []

    def in_thread() -> None:
        try:
            asyncio.run(run())
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    worker = threading.Thread(target=in_thread)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "the websocket exchange did not finish"
    if failure:
        raise failure[0]


def test_a_notebook_kernel_running_code_is_reported_busy(portal: FakePortal, start_agent: StartAgent) -> None:
    """The real path behind `kernel_busy`: JupyterLab, an ipykernel, and code running in it."""
    start_agent()
    spec = task_spec(23, "", kind="notebook", grace_s=10)
    portal.set_desired("node-t1", [spec])
    url = portal.wait_for(lambda: portal.statuses_of(23, "running"), what="notebook started")[0]["notebook_url"]
    base, token = url.split("?token=")

    def answers() -> object:
        try:
            return _get_json(f"{base}api/status?token={token}")
        except OSError:
            return None

    portal.wait_for(answers, timeout=60, what="jupyter /api/status")
    assert "/lab" in urllib.request.urlopen(f"{base}?token={token}", timeout=10).url  # JupyterLab is what opens
    request = urllib.request.Request(f"{base}api/kernels?token={token}", data=b'{"name": "python3"}', method="POST")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=30) as response:
        kernel_id = json.loads(response.read())["id"]
    _execute_over_websocket(base, token, kernel_id, "import time; time.sleep(300)")  # interrupted below

    def reported(busy: bool) -> Callable[[], dict[str, object] | None]:
        def check() -> dict[str, object] | None:
            beats = portal.heartbeats("node-t1")
            notebook = next((t["notebook"] for t in beats[-1]["tasks"] if t["task_id"] == 23), None) if beats else None
            return notebook if notebook and notebook["kernel_busy"] is busy else None

        return check

    notebook = portal.wait_for(reported(True), timeout=15, what="kernel_busy in a heartbeat")
    assert notebook["kernels"] == 1 and notebook["last_activity"] is not None
    # Interrupting the cell ends the busy spell, and the next heartbeat says so.
    interrupt = urllib.request.Request(f"{base}api/kernels/{kernel_id}/interrupt?token={token}", data=b"", method="POST")
    urllib.request.urlopen(interrupt, timeout=10).close()
    portal.wait_for(reported(False), timeout=15, what="kernel idle again in a heartbeat")
    portal.set_desired("node-t1", [{**spec, "action": "stop"}])
    exited = portal.wait_for(lambda: portal.statuses_of(23, "exited"), timeout=20, what="notebook stopped")[-1]
    assert exited["stopped_by"] == "sigterm"


def test_an_unreadable_journal_stops_the_agent_with_a_message_instead_of_guessing(portal: FakePortal, tmp_path: Path) -> None:
    state = tmp_path / "j1"
    state.mkdir()
    (state / "journal.json").write_text('{"tasks": [{"task_id": 1,')
    config = AgentConfig(portal=portal.url, token=portal.add_node("node-j1"), name="node-j1", state_dir=state)
    with pytest.raises(AgentFatal, match=r"journal .* is unreadable"):
        Agent(config, SimulatedGpus(gpus_from_spec("1xH100", node="node-j1"))).run()


def test_a_new_node_token_kills_the_old_identitys_workloads_and_reuses_nothing(
    portal: FakePortal, start_agent: StartAgent, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    first = start_agent("node-i1")
    portal.set_desired("node-i1", [task_spec(60, f"echo old >> {runs}; exec sleep 60")])
    old = portal.wait_for(lambda: first.record(60), what="task 60 started")
    portal.wait_for(lambda: old.running_reported, what="task 60 reported")
    first.stop()
    portal.stop()
    fresh = FakePortal().start()  # a new portal (a fresh demo database) that reuses task id 60
    try:
        fresh.add_node("node-i1")
        fresh.set_desired("node-i1", [task_spec(60, f"echo new >> {runs}; exec sleep 60")])
        second = start_agent("node-i1", portal=fresh.url, token=fresh.nodes["node-i1"].token)
        new = fresh.wait_for(lambda: second.record(60), what="task 60 started by the new identity")
        assert new.pid != old.pid and wait_gone(old.pid, timeout=10)
        fresh.wait_for(lambda: runs.read_text() == "old\nnew\n", what="the new task's output")
    finally:
        fresh.stop()
