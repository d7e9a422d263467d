"""The supervisor of `make run`: the web server, the Celery worker, beat and the simulated fleet.

    python -m portal.devserver [--bind 127.0.0.1:8000] [--var var]

(scripts/run-demo.sh migrates and seeds first, then runs this.) Each process runs in a session of its
own, so a Ctrl-C in the terminal reaches only this supervisor, which then stops them in order:

* a process that dies is restarted after a backoff (1 s, doubling to 30 s; back to 1 s once it has
  stayed up for a minute), and the console says so: ``worker exited with code -9 (SIGKILL); restarting in 1 s``;
* SIGTERM or Ctrl-C stops everything within STOP_WITHIN_S (10 s): the fleet stops its workloads
  (`--stop-workloads-on-exit`: SIGTERM, a short grace, SIGKILL), the worker and beat get SIGTERM (a warm
  shutdown) and the web server once the fleet is gone; whatever still runs at KILL_AT_S is SIGKILLed with
  its whole process group, and a last sweep SIGKILLs any process still carrying this run's marker
  variable (every child and every workload inherits it), so nothing outlives the demo;
* the notebook proxy (uvicorn serving portal.asgi: HTTP and websockets to the nodes' Jupyter servers)
  runs beside the web server, on --notebook-bind (127.0.0.1:8001);
* the console shows the web server's lines (people's requests; the agents' only when failed or slow,
  portal/weblog.py), the supervisor's, and the others' errors; every line of every process is in
  var/logs/<name>.log.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

REPO = Path(__file__).resolve().parent.parent
MARKER = "YARD_DEVSERVER_RUN"
STOP_WITHIN_S = 10.0
# SIGKILL for what is left, with time to spare for the sweep and our own exit.
KILL_AT_S = 8.0
# The web server outlives the fleet (agents finish their last calls) but not this.
WEB_AFTER_S = 5.0
BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0
STABLE_AFTER_S = 60.0
# Lines of the worker, beat and fleet that also go to the console.
_CONSOLE_WORDS = ("ERROR", "CRITICAL", "Traceback", "Unrecoverable")
_PR_SET_PDEATHSIG = 1


def _now() -> str:
    return time.strftime("%H:%M:%S")


class Console:
    """One lock for every line on the terminal, so that lines of several processes never interleave."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.lock = threading.Lock()

    def say(self, text: str) -> None:
        self.line(f"{_now()} [devserver] {text}")

    def line(self, text: str) -> None:
        with self.lock:
            self.stream.write(text + "\n")
            self.stream.flush()


try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:
    _LIBC = None


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: a single system call, nothing that takes a lock.
    # Should the supervisor itself be SIGKILLed, the kernel sends each child SIGTERM (Linux only).
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"code {code} ({signal.Signals(-code).name})"
        except ValueError:
            return f"code {code}"
    return f"code {code}"


@dataclass
class Service:
    name: str
    argv: list[str]
    console_all: bool = False  # every line to the console (the web server), or only errors
    stop_signal: signal.Signals = signal.SIGTERM
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff_s: float = BACKOFF_INITIAL_S
    restart_at: float | None = None
    log_thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


class Supervisor:
    def __init__(self, services: list[Service], *, env: dict[str, str], log_dir: Path, console: Console) -> None:
        self.services = services
        self.env = env
        self.log_dir = log_dir
        self.console = console
        self.stop_requested = threading.Event()
        self.kill_now = threading.Event()
        self.run_id = env[MARKER]

    # -- processes ---------------------------------------------------------------------------------
    def start(self, service: Service) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        service.process = subprocess.Popen(
            service.argv,
            cwd=REPO,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        service.started_at = time.monotonic()
        service.restart_at = None
        service.log_thread = threading.Thread(
            target=self._pump, args=(service, service.process), name=f"log-{service.name}", daemon=True
        )
        service.log_thread.start()

    def _pump(self, service: Service, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        with open(self.log_dir / f"{service.name}.log", "ab") as log:
            for raw in iter(process.stdout.readline, b""):
                log.write(raw)
                log.flush()
                text = raw.decode(errors="replace").rstrip()
                if service.console_all or any(word in text for word in _CONSOLE_WORDS):
                    self.console.line(f"[{service.name}] {text}")

    def check(self) -> None:
        """Restart what died, after its backoff."""
        now = time.monotonic()
        for service in self.services:
            if service.process is None:
                continue
            code = service.process.poll()
            if code is None:
                if now - service.started_at >= STABLE_AFTER_S:
                    service.backoff_s = BACKOFF_INITIAL_S
                continue
            if service.restart_at is None:
                delay = service.backoff_s
                service.backoff_s = min(BACKOFF_MAX_S, service.backoff_s * 2)
                service.restart_at = now + delay
                self.console.say(f"{service.name} exited with {describe_exit(code)}; restarting in {delay:.0f} s")
            elif now >= service.restart_at:
                service.restarts += 1
                self.start(service)
                self.console.say(f"{service.name} restarted (pid {service.process.pid if service.process else '?'})")

    # -- stopping ------------------------------------------------------------------------------------
    def _signal(self, service: Service, signum: signal.Signals) -> None:
        if service.alive and service.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(service.process.pid, signum)

    def _kill_group(self, service: Service) -> None:
        if service.process is not None:
            # The whole session: Celery's pool processes, gunicorn's workers.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(service.process.pid, signal.SIGKILL)

    def stop(self) -> None:
        t0 = time.monotonic()
        self.console.say("stopping: fleet and its workloads, worker, beat, then the web server")
        by_name = {s.name: s for s in self.services}
        web = by_name.get("web")
        for service in self.services:
            if service is not web:
                self._signal(service, service.stop_signal)
        fleet = by_name.get("fleet")
        web_signalled = False
        while time.monotonic() - t0 < KILL_AT_S and not self.kill_now.is_set():
            if (
                web is not None
                and not web_signalled
                and (fleet is None or not fleet.alive or time.monotonic() - t0 >= WEB_AFTER_S)
            ):
                self._signal(web, web.stop_signal)
                web_signalled = True
            if not any(s.alive for s in self.services):
                break
            time.sleep(0.05)
        for service in self.services:
            if service.alive:
                self.console.say(f"{service.name} still running after {time.monotonic() - t0:.1f} s: SIGKILL")
            # Even a leader that exited may leave its group behind (a pool child): kill the group anyway.
            self._kill_group(service)
        for service in self.services:
            if service.process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    service.process.wait(timeout=max(0.1, STOP_WITHIN_S - 0.5 - (time.monotonic() - t0)))
        leftovers = self.sweep()
        if leftovers:
            self.console.say(f"SIGKILLed what was left of this run: {', '.join(leftovers)}")
        self.console.say(f"stopped in {time.monotonic() - t0:.1f} s")

    def sweep(self) -> list[str]:
        """SIGKILL every process (other than ourselves) whose environment carries this run's marker."""
        needle = f"{MARKER}={self.run_id}".encode()
        killed = []
        for pid in marked_pids(needle):
            if pid == os.getpid():
                continue
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                name = "?"
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(f"{name} ({pid})")
        return killed

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_requested.is_set():
            self.kill_now.set()  # a second Ctrl-C: no more waiting
        self.stop_requested.set()

    def run(self, *, ready: Callable[[], bool], banner: str) -> int:
        signal.signal(signal.SIGTERM, self.on_signal)
        signal.signal(signal.SIGINT, self.on_signal)
        web, rest = self.services[0], self.services[1:]
        self.start(web)
        deadline = time.monotonic() + 60
        while not ready() and time.monotonic() < deadline and not self.stop_requested.is_set():
            if not web.alive:
                break
            time.sleep(0.2)
        for service in rest:
            self.start(service)
        if not self.stop_requested.is_set():
            self.console.line(banner)
        while not self.stop_requested.wait(0.2):
            self.check()
        self.stop()
        return 0


def marked_pids(needle: bytes) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry.name}/environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _port_open(bind: str) -> Callable[[], bool]:
    host, _, port = bind.rpartition(":")

    def check() -> bool:
        with socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(0.5)
            return sock.connect_ex((host.strip("[]"), int(port))) == 0

    return check


def services_for(args: argparse.Namespace) -> list[Service]:
    py = sys.executable
    var = Path(args.var)
    portal_url = f"http://{args.bind}"
    worker = [py, "-m", "celery", "-A", "portal", "worker", "--concurrency", str(args.worker_concurrency), "--loglevel", "INFO"]
    # No mingle, gossip or worker heartbeats: one worker has no peers to sync with, and on the
    # filesystem broker each is a broadcast that piles up files for workers long gone.
    worker += ["--without-mingle", "--without-gossip", "--without-heartbeat", "-n", f"demo-{os.getpid()}@%h"]
    beat = [py, "-m", "celery", "-A", "portal", "beat", "--schedule", str(var / "celerybeat-schedule"), "--loglevel", "INFO"]
    # The notebook proxy (portal/notebook_proxy.py): browsers open notebooks through it, HTTP and websockets,
    # which gunicorn's gthread workers cannot hold. Its access log stays in var/logs (JupyterLab loads a
    # hundred files at a time); its errors reach the console.
    nb_host, _, nb_port = args.notebook_bind.rpartition(":")
    notebooks = [py, "-m", "uvicorn", "portal.asgi:application", "--host", nb_host.strip("[]"), "--port", nb_port]
    notebooks += ["--ws", "websockets-sansio", "--lifespan", "on", "--no-server-header", "--timeout-graceful-shutdown", "3"]
    services = [
        Service("web", [py, "-m", "gunicorn", "-c", str(REPO / "portal" / "gunicorn.conf.py"), "portal.wsgi"], console_all=True),
        Service("worker", worker),
        Service("beat", beat),
        Service("notebooks", notebooks),
    ]
    tokens = var / "agent-tokens.json"
    if not args.no_fleet and tokens.exists():
        fleet = [
            py,
            "-m",
            "nodeagent.fleet",
            "--portal",
            portal_url,
            "--tokens-file",
            str(tokens),
            "--state-dir",
            str(var / "agents"),
        ]
        services.append(Service("fleet", [*fleet, "--stop-workloads-on-exit", "--workload-grace", "3"]))
    return services


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m portal.devserver", description=__doc__.split("\n")[0])
    parser.add_argument("--bind", default=os.environ.get("YARD_BIND", "127.0.0.1:8000"), help="host:port of the portal")
    parser.add_argument("--var", default=os.environ.get("YARD_VAR_DIR", str(REPO / "var")), help="the demo's state folder")
    parser.add_argument(
        "--notebook-bind",
        default=os.environ.get("YARD_NOTEBOOK_BIND", "127.0.0.1:8001"),
        help="host:port of the notebook proxy (browsers open notebooks there, through the portal's session)",
    )
    parser.add_argument("--worker-concurrency", type=int, default=2)
    parser.add_argument("--no-fleet", action="store_true", help="no simulated node agents")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    env = {
        **os.environ,
        MARKER: uuid.uuid4().hex,
        "PYTHONUNBUFFERED": "1",
        "YARD_BIND": args.bind,
        "YARD_VAR_DIR": str(Path(args.var).resolve()),
        # Where the portal's links send browsers to open a notebook: the notebook proxy started below.
        "YARD_NOTEBOOK_URL": os.environ.get("YARD_NOTEBOOK_URL") or f"http://{args.notebook_bind}",
    }
    console = Console(sys.stdout)
    supervisor = Supervisor(services_for(args), env=env, log_dir=Path(args.var) / "logs", console=console)
    banner = (
        f"\n  Yardmaster is up:  http://{args.bind}\n"
        "  Sign in as admin / yardmaster-demo (cluster admin), rita (org admin), bob (team lead),\n"
        "  alice or carol (team members); every demo password is yardmaster-demo.\n"
        f"  Notebooks open through the portal's notebook proxy at http://{args.notebook_bind}/notebooks/<id>/lab/.\n"
        f"  Logs of the web server, worker, beat and agents: {Path(args.var) / 'logs'}/   Ctrl-C stops everything.\n"
    )
    return supervisor.run(ready=_port_open(args.bind), banner=banner)


if __name__ == "__main__":
    sys.exit(main())
