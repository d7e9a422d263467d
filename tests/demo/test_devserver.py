"""`make run`'s supervisor (portal/devserver.py) with everything real: gunicorn, the Celery worker and
beat on the embedded broker, the simulated fleet of 40 agents and the workloads they start.

Seen before: the worker died and nothing restarted it; SIGTERM left the worker in warm shutdown for
more than 45 s; stopping `make run` left 43 workload process groups (JupyterLab servers, sleeps) running.
Every process of a run here carries a marker variable, so the test counts them through /proc.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.demo.helpers import REPO, call, free_port, job_body, manage, server_env, service_token, wait_for

pytestmark = pytest.mark.slow
MARK = "YARD_TEST_DEMO"


def marked(mark: str) -> dict[int, str]:
    """pid -> command line of every live (not zombie) process whose environment carries the marker."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2] in "ZX":
                continue
            found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


@dataclass
class Run:
    process: subprocess.Popen[bytes]
    url: str
    var: Path
    env: dict[str, str]
    mark: str
    lines: list[str] = field(default_factory=list)

    def console(self) -> str:
        return "\n".join(self.lines)

    def children(self, word: str) -> list[int]:
        return [pid for pid, cmd in marked(self.mark).items() if word in cmd]


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated and seeded demo var folder, copied by each test (seeding 40 nodes takes a while)."""
    var = tmp_path_factory.mktemp("demo-template")
    env = server_env(var)
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "seed_demo", "--agent-tokens", str(var / "agent-tokens.json"))
    manage(env, "collectstatic", "--noinput", "-v0")
    return var


def _start(seeded: Path, tmp_path: Path, argv: list[str]) -> Run:
    var = tmp_path / "var"
    shutil.copytree(seeded, var)
    port = free_port()
    mark = uuid.uuid4().hex
    env = server_env(var, **{MARK: mark})
    process = subprocess.Popen(
        [*argv, "--bind", f"127.0.0.1:{port}"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    run = Run(process=process, url=f"http://127.0.0.1:{port}", var=var, env=env, mark=mark)

    def read() -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            run.lines.append(raw.decode(errors="replace").rstrip())

    threading.Thread(target=read, daemon=True).start()
    wait_for("the demo to be up", lambda: "Yardmaster is up" in run.console() or process.poll() is not None, timeout=180)
    assert process.poll() is None, run.console()
    return run


def _stop(run: Run) -> None:
    if run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)
        try:
            run.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            run.process.kill()
    for pid in marked(run.mark):  # nothing of a failed test may outlive it
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def demo(seeded: Path, tmp_path: Path) -> Iterator[Run]:
    run = _start(seeded, tmp_path, [sys.executable, "-m", "portal.devserver"])
    yield run
    _stop(run)


def test_a_killed_worker_is_restarted_and_the_console_says_so(demo: Run) -> None:
    workers = wait_for("the Celery worker", lambda: [p for p in demo.children("celery") if "worker" in marked(demo.mark)[p]])
    main = min(workers)  # the worker's main process started before its pool children
    os.kill(main, signal.SIGKILL)

    wait_for("the restart", lambda: "worker restarted" in demo.console(), timeout=60)
    assert "worker exited with code -9 (SIGKILL); restarting in 1 s" in demo.console()
    again = wait_for("a new worker", lambda: [p for p in demo.children("celery") if "worker" in marked(demo.mark).get(p, "")])
    assert main not in again


def _jupyter_kernel(run: Run) -> None:
    """Start a kernel in the demo's notebook server, as opening the notebook in JupyterLab does."""
    pid, server = wait_for(
        "the JupyterLab server",
        lambda: [(p, c) for p, c in marked(run.mark).items() if "jupyterlab" in c and "--ServerApp.port=" in c],
        timeout=120,
    )[0]
    port = re.search(r"--ServerApp\.port=(\d+)", server)[1]  # type: ignore[index]
    # The token is in the server's environment, never on its command line (where `ps` shows it).
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    token = next(v.split(b"=", 1)[1].decode() for v in environ if v.startswith(b"JUPYTER_TOKEN="))
    assert token not in server
    base = re.search(r"--ServerApp\.base_url=(\S+)", server)[1]  # type: ignore[index]  # the portal's path
    wait_for(
        "JupyterLab to answer",
        lambda: call("GET", f"http://127.0.0.1:{port}{base}api/status?token={token}")[0] == 200,
        timeout=120,
    )
    status, kernel = call("POST", f"http://127.0.0.1:{port}{base}api/kernels?token={token}", body={"name": "python3"})
    assert status == 201, kernel
    wait_for("the kernel process", lambda: any("ipykernel" in c for c in marked(run.mark).values()), timeout=120)


def test_sigterm_stops_the_server_worker_beat_fleet_and_every_workload(seeded: Path, tmp_path: Path) -> None:
    run = _start(seeded, tmp_path, ["bash", "scripts/run-demo.sh"])  # the whole `make run` path
    try:
        token = service_token(run.env)
        for name in ("held-a", "held-b"):
            assert (
                call("POST", f"{run.url}/api/v1/jobs", token=token, body=job_body(name, "sleep 600 & sleep 600; wait"))[0] == 201
            )
        assert (
            call("POST", f"{run.url}/api/v1/notebooks", token=token, body={"name": "nb", "team": "pretraining", "gpus": 1})[0]
            == 201
        )
        wait_for(
            "both jobs' sleeps",
            lambda: len([c for c in marked(run.mark).values() if c.startswith("sleep 600")]) == 4,
            timeout=120,
        )
        _jupyter_kernel(run)
        before = marked(run.mark)
        for word in ("gunicorn", "celery", "nodeagent.fleet", "sleep 600", "jupyterlab", "ipykernel"):
            assert any(word in cmd for cmd in before.values()), f"no {word} process: {before}"

        run.process.send_signal(signal.SIGTERM)
        # The supervisor itself bounds its stop at 10 s: SIGKILL for what is left at 8 s, then a sweep.
        run.process.wait(timeout=10)
        assert marked(run.mark) == {}
        assert "stopped in" in run.console()
    finally:
        _stop(run)
