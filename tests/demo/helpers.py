"""Real servers for the demo tests: gunicorn (and the supervisor) as subprocesses on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# Whatever the test run's environment says about these, a demo or server here gets only what we give it.
_SCRUB = {"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DEBUG", "DJANGO_SETTINGS_MODULE", "YARD_VAR_DIR", "ALLOWED_HOSTS"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_env(var: Path, **extra: str) -> dict[str, str]:
    """The SQLite demo's environment (nothing set) in its own var folder, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in _SCRUB}
    env.update({"YARD_VAR_DIR": str(var), "STATIC_ROOT": str(var / "static"), "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def manage(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"manage.py {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def wait_for(what: str, condition: Callable[[], Any], *, timeout: float = 60.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@contextlib.contextmanager
def gunicorn(env: dict[str, str], log: Path) -> Iterator[str]:
    """gunicorn with the project's config on a free port; yields its base URL."""
    port = free_port()
    with open(log, "ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "gunicorn", "-c", "portal/gunicorn.conf.py", "portal.wsgi"],
            cwd=REPO,
            env={**env, "YARD_BIND": f"127.0.0.1:{port}"},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for("gunicorn to listen", lambda: port_open(port) or process.poll() is not None)
        assert process.poll() is None, log.read_text()
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def call(method: str, url: str, *, token: str | None = None, body: Any = None, timeout: float = 60) -> tuple[int, Any]:
    """One HTTP request; (status, parsed JSON or text). Errors are answers too (status 0: no connection)."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"} if data is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:  # refused, reset: no answer at all
        return 0, str(exc)
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


SHED: list[str] = []  # the URLs answered 503 "overloaded" and retried by call_politely, for the tests to report


def call_politely(method: str, url: str, *, retry: tuple[str, ...] = ("overloaded",), **kwargs: Any) -> tuple[int, Any]:
    """As the CLI calls: a request the web tier shed (503 "overloaded", portal/middleware.py
    AdmissionMiddleware) is retried after a second, as its Retry-After asks; any other answer is final.
    ``retry`` names the 503 codes retried (the CLI retries every 503; a test that must see "unavailable"
    keeps the default)."""
    for _ in range(30):
        status, body = call(method, url, **kwargs)
        if not (status == 503 and isinstance(body, dict) and body.get("code") in retry):
            return status, body
        SHED.append(url)
        time.sleep(1.0)
    return status, body


def service_token(env: dict[str, str], team: str = "pretraining") -> str:
    out = manage(env, "create_token", "--team", team, "--name", f"tests-{os.getpid()}-{time.monotonic_ns()}")
    return out.strip().splitlines()[-1].strip()  # the command prints the raw token alone on its last line


def node_tokens(var: Path) -> dict[str, str]:
    nodes = json.loads((var / "agent-tokens.json").read_text())["nodes"]
    return {name: entry["token"] for name, entry in nodes.items()}


def job_body(name: str, command: str = "sleep 600", **fields: Any) -> dict[str, Any]:
    return {"name": name, "team": "pretraining", "replicas": 1, "gpus_per_replica": 8, "gpu_type": "H100",
            "command": command, "time_limit_s": 7200, **fields}  # fmt: skip
