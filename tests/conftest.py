"""Shared by every test folder: how Playwright launches Debian's Chromium (no browser download here), and
a live server that has finished its requests before pytest-django flushes the database under it."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.signals import request_finished, request_started

CHROMIUM = "/usr/bin/chromium"


@pytest.fixture(scope="session")
def browser_type_launch_args(browser_type_launch_args: dict[str, Any]) -> dict[str, Any]:
    return {
        **browser_type_launch_args,
        "executable_path": CHROMIUM,
        "headless": True,
        "args": [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
        ],
    }


@pytest.fixture(scope="session")
def browser_context_args(browser_context_args: dict[str, Any]) -> dict[str, Any]:
    # A laptop screen.
    return {**browser_context_args, "viewport": {"width": 1366, "height": 860}}


class _InFlight:
    """Requests the live server has started and not yet finished (the signals fire in its threads)."""

    def __init__(self) -> None:
        self.count = 0
        self.lock = threading.Lock()

    def started(self, **_: Any) -> None:
        with self.lock:
            self.count += 1

    def finished(self, **_: Any) -> None:
        with self.lock:
            self.count -= 1

    def wait_idle(self, *, timeout: float = 15.0, quiet: float = 0.3) -> None:
        """Until no request has been in flight for `quiet` seconds; a request may still be arriving."""
        deadline = time.monotonic() + timeout
        quiet_since: float | None = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            if self.count > 0:
                quiet_since = None
            elif quiet_since is None:
                quiet_since = now
            elif now - quiet_since >= quiet:
                return
            time.sleep(0.05)


_in_flight = _InFlight()
request_started.connect(_in_flight.started, dispatch_uid="tests.in_flight.started")
request_finished.connect(_in_flight.finished, dispatch_uid="tests.in_flight.finished")


@pytest.fixture(autouse=True)
def _live_server_settles(request: pytest.FixtureRequest) -> Iterator[None]:
    """Torn down after the test's own fixtures (its agents are dead, its browser closed) and before the
    database flush: a request still in the live server's threads would otherwise hold row locks that
    deadlock the flush's TRUNCATE, or run against the next test's database."""
    yield
    if "live_server" in request.fixturenames:
        _in_flight.wait_idle()
