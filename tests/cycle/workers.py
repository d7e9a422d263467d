"""Real Celery worker processes pointed at the test database, for the concurrency tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
WORKER_ARGS = ("-P", "solo", "-l", "INFO", "--without-heartbeat", "--without-gossip", "--without-mingle")


def test_database_url() -> str:
    """The URL of pytest-django's test database (test_<name>), for processes outside this one."""
    s = connection.settings_dict
    user = s.get("USER") or "postgres"
    password = f":{s['PASSWORD']}" if s.get("PASSWORD") else ""
    return f"postgres://{user}{password}@{s.get('HOST') or '127.0.0.1'}:{s.get('PORT') or 5432}/{s['NAME']}"


class Worker:
    def __init__(self, name: str, log_dir: Path, **env: str) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        environment = {
            **os.environ,
            "DATABASE_URL": test_database_url(),
            "REDIS_URL": settings.REDIS_URL,
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            "LOG_LEVEL": "INFO",
            **env,
        }
        self._log = self.log_path.open("w")
        # solo pool: the cycle runs in the worker process itself, so a SIGKILL of the process kills it mid-apply
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "portal",
                "worker",
                "-P",
                "solo",
                "-l",
                "INFO",
                "-n",
                f"{name}@%h",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            cwd=ROOT,
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready." in self.log_path.read_text():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.name} exited:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"worker {self.name} not ready:\n{self.log_path.read_text()[-3000:]}")

    def cycles_run(self) -> int:
        return self.log_path.read_text().count("cycle epoch ")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
