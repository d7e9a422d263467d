"""Browser tests: Debian's Chromium through Playwright against the live test server, with REAL node
agents on simulated GPUs (one `python -m nodeagent.fleet` subprocess) and the scheduling cycle run
every half second by a thread of this process, as Celery beat would.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from scheduling.cycle import run_cycle_once
from scheduling.models import Node, NodeState
from tenants.models import Role
from tests.agent_api.conftest import issue_enrolment_token
from tests.e2e.conftest import wait_for
from tests.factories import Org, make_org, make_user
from tests.portal.conftest import _yard_context_processor  # noqa: F401 - autouse: teams and roles in the top bar

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
PASSWORD = "browser-test-pass-1"
MARK = "YARD_BROWSER_RUN"
CYCLE_EVERY_S = 0.5
FAST = {"HEARTBEAT_INTERVAL_S": 0.5, "GRACE_PERIOD_S": 3.0}

# Playwright's sync API runs an event loop in the test's thread; the test's own ORM calls are plain
# sync code, so Django's async-safety check must be told so before anything touches the database.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if Path(CHROMIUM).exists():
        return
    skip = pytest.mark.skip(reason=f"Debian's chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    for item in items:
        if "tests/browser/" in str(item.fspath):
            item.add_marker(skip)


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(page: Any, base_url: str, username: str) -> None:
    page.goto(f"{base_url}/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base_url}/")


@dataclass
class People:
    org: Org
    ann: Any  # member of team-a
    ben: Any  # member of team-b
    oli: Any  # org admin of Research


@pytest.fixture
def people(transactional_db: Any, settings: Any, tmp_path: Path) -> People:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.YARD = {**settings.YARD, **FAST, "CHECKPOINT_ROOT": str(tmp_path / "checkpoints")}
    org = make_org()
    return People(
        org=org,
        ann=make_user("ann", unit=org.team_a, password=PASSWORD),
        ben=make_user("ben", unit=org.team_b, password=PASSWORD),
        oli=make_user("oli", unit=org.bu, role=Role.ORG_ADMIN, password=PASSWORD),
    )


@dataclass
class Cluster:
    """A fleet of simulated nodes and the scheduling cycle, both running while a test drives the browser."""

    url: str
    root: Path
    mark: str = field(default_factory=lambda: uuid.uuid4().hex)
    fleet: subprocess.Popen[bytes] | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    scheduling: threading.Event = field(default_factory=threading.Event)
    cycle_errors: list[BaseException] = field(default_factory=list)

    def start_fleet(self, *, nodes: int, gpus: int, nodes_per_leaf: int) -> None:
        command = [
            sys.executable, "-m", "nodeagent.fleet", "--portal", self.url, "--token", issue_enrolment_token(),
            "--simulate-nodes", f"{nodes}x{gpus}xH100", "--nodes-per-leaf", str(nodes_per_leaf), "--leaves-per-spine", "2",
            "--state-dir", str(self.root / "fleet"), "--tick", "0.3",
        ]  # fmt: skip
        log = open(self.root / "fleet.log", "ab")  # noqa: SIM115 - the child holds it
        self.fleet = subprocess.Popen(command, cwd=REPO, env={**os.environ, MARK: self.mark}, stdout=log, stderr=log)
        wait_for(
            f"{nodes} nodes READY",
            lambda: Node.objects.filter(state=NodeState.READY).count() == nodes,
            timeout=60,
        )

    def _cycle_loop(self) -> None:
        try:
            while not self.stop.wait(CYCLE_EVERY_S):
                if self.scheduling.is_set():
                    run_cycle_once()
        except BaseException as exc:
            self.cycle_errors.append(exc)
        finally:
            connection.close()

    def start_cycle(self) -> threading.Thread:
        self.scheduling.set()
        thread = threading.Thread(target=self._cycle_loop, name="cycle", daemon=True)
        thread.start()
        return thread

    def log(self) -> str:
        path = self.root / "fleet.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def shutdown(self, cycle: threading.Thread | None) -> None:
        self.stop.set()
        if cycle is not None:
            cycle.join(timeout=30)
        if self.fleet is not None:
            self.fleet.send_signal(signal.SIGTERM)
            try:
                self.fleet.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.fleet.kill()
                self.fleet.wait(timeout=10)
        # Workloads run in their own sessions and outlive a killed agent by design: end what is left.
        for pid in _marked(self.mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _marked(mark: str) -> set[int]:
    needle = f"{MARK}={mark}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
    return found


@pytest.fixture
def cluster(live_server: Any, people: People, tmp_path: Path) -> Iterator[Cluster]:
    """Six nodes of 8 simulated H100 (two to a leaf, two leaves to a spine), and the cycle running."""
    c = Cluster(url=live_server.url, root=tmp_path)
    cycle = None
    try:
        c.start_fleet(nodes=6, gpus=8, nodes_per_leaf=2)
        cycle = c.start_cycle()
        yield c
    finally:
        c.shutdown(cycle)
    assert not c.cycle_errors, c.cycle_errors
