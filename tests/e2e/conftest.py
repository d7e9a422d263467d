"""End to end: real node agents (``python -m nodeagent`` subprocesses) against the real portal.

The portal is pytest-django's live server (a thread of this process, transactional database); the
test itself plays the scheduler's Celery beat by calling the cycle and the liveness check in-process.
Every process an agent starts inherits a marker variable, so a test can find and count them through
/proc, and nothing outlives the test.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Node, NodeState, Task
from scheduling.services import JobSpec, job_submit
from tenants.services import token_create_personal
from tests.agent_api.conftest import issue_enrolment_token
from tests.factories import make_org, make_user

MARK = "YARD_E2E_RUN"
REPO = Path(__file__).resolve().parents[2]
# Fast timings so a test sees several heartbeats per second (the relations of the defaults hold).
FAST = {"HEARTBEAT_INTERVAL_S": 0.5, "GRACE_PERIOD_S": 5.0}


def marked_pids(mark: str, *, task_id: int | None = None) -> set[int]:
    """Processes whose environment carries this run's marker (agents and their workloads), or one task's."""
    needles = {f"{MARK}={mark}".encode()}
    if task_id is not None:
        needles.add(f"YARD_TASK_ID={task_id}".encode())
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needles <= set((entry / "environ").read_bytes().split(b"\0")):
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def is_watchdog(pid: int) -> bool:
    """The node's watchdog (nodeagent/watchdog.py) carries the agent's environment, marker included."""
    try:
        return b"nodeagent.watchdog" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie or a dead one does not), read from /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_for(what: str, condition: Callable[[], Any], *, timeout: float = 20.0, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Harness:
    url: str
    root: Path
    enrolment: str
    org: Any
    user: Any
    api_token: str
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # -- agents ----------------------------------------------------------------------------------
    def start_agent(
        self, name: str, *, gpus: int = 2, leaf: str = "leaf-1", env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """``env``: more for the agent's environment (libfaketime's, say); its state dir is agents/<name>."""
        command = [
            sys.executable, "-m", "nodeagent",
            "--portal", self.url, "--token", self.enrolment,
            "--simulate", f"{gpus}xH100", "--name", name, "--address", "127.0.0.1",
            "--leaf", leaf, "--spine", "spine-1", "--state-dir", str(self.root / "agents" / name),
        ]  # fmt: skip
        log = open(self.root / f"agent-{name}.log", "ab")  # noqa: SIM115 - the child holds it
        environment = {**os.environ, **(env or {}), MARK: self.mark}
        process = subprocess.Popen(command, cwd=REPO, env=environment, stdout=log, stderr=log)
        self.agents[name] = process
        return process

    def kill_agent(self, name: str) -> None:
        process = self.agents.pop(name)
        process.kill()
        process.wait(timeout=10)

    def agent_log(self, name: str) -> str:
        return (self.root / f"agent-{name}.log").read_text(errors="replace")

    def workload_pids(self, task: Task | None = None) -> set[int]:
        """Marked processes that are not agents or their watchdogs: the workloads and their wrappers (of one task, if given)."""
        pids = marked_pids(self.mark, task_id=task.pk if task else None) - {p.pid for p in self.agents.values()}
        return {pid for pid in pids if not is_watchdog(pid)}

    def watchdog_pids(self) -> set[int]:
        return {pid for pid in marked_pids(self.mark) if is_watchdog(pid)}

    def node_ready(self, name: str) -> Node:
        return wait_for(f"node {name} READY", lambda: Node.objects.filter(name=name, state=NodeState.READY).first(), timeout=30)

    # -- jobs ------------------------------------------------------------------------------------
    def submit(self, name: str, command: str, **fields: Any) -> Job:
        env = {"OUT_DIR": str(self.root), "PYTHONUNBUFFERED": "1", **fields.pop("env", {})}
        return job_submit(user=self.user, spec=JobSpec(name=name, team=self.org.team_a, command=command, env=env, **fields))

    def place(self, job: Job) -> None:
        """One scheduling cycle, as the beat would run it; the job must be placed by it."""
        result = run_cycle_once()
        assert job.pk in result.placed, f"job {job.pk} not placed: {Job.objects.get(pk=job.pk).pending_reason}"

    def job_in(self, job: Job, *states: str, timeout: float = 30.0) -> Job:
        def check() -> Job | None:
            fresh = Job.objects.get(pk=job.pk)
            return fresh if fresh.state in states else None

        return wait_for(f"job {job.pk} in {states}", check, timeout=timeout)

    def tasks(self, job: Job, attempt: int = 1) -> list[Task]:
        return list(Task.objects.filter(job=job, attempt=attempt).order_by("rank"))

    def api_get(self, path: str) -> Any:
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.api_token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    # -- cleanup ---------------------------------------------------------------------------------
    def stop_everything(self) -> None:
        for process in self.agents.values():
            process.kill()
        for process in self.agents.values():
            process.wait(timeout=10)
        # Workloads run in their own sessions and outlive a killed agent by design: end them too.
        for _ in range(3):
            pids = marked_pids(self.mark)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)


def script(root: Path, name: str, body: str) -> str:
    """Write a workload script; return the shell command that runs it with this interpreter.

    `exec`, because the agent runs the command with `/bin/sh -c`, and dash does not exec a lone
    command itself: that shell would die of the group's SIGTERM (exit 143) before the workload
    exits cleanly from its handler, and the clean exit would be reported as signal 15.
    """
    path = root / f"{name}.py"
    path.write_text(body)
    return f"exec {sys.executable} {path}"


@pytest.fixture
def harness(live_server: Any, settings: Any, tmp_path: Path) -> Iterator[Harness]:
    settings.YARD = {**settings.YARD, **FAST, "CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    org = make_org()
    user = make_user("alice", unit=org.team_a)
    h = Harness(
        url=live_server.url,
        root=tmp_path,
        enrolment=issue_enrolment_token(),
        org=org,
        user=user,
        api_token=token_create_personal(user=user, name="e2e", expires_at=None).raw,
    )
    try:
        yield h
    finally:
        h.stop_everything()
