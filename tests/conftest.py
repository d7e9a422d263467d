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
    """Requests that server threads have started and not yet finished (the signals fire in those threads).

    Only threads other than the main one count. The main thread is the test's own: the test client and
    schemathesis's in-process WSGI calls run there, and they cannot overlap the flush, which runs there
    too. Worse, schemathesis never closes the responses it gets from the WSGI app, so their
    request_finished never fires: a single process-wide counter stayed above zero from that test on, and
    every later live-server teardown waited out the whole timeout (15 s each, 17 tests). Keyed by thread,
    and a thread that has ended counts as finished whatever its signals said.
    """

    def __init__(self) -> None:
        self.open: dict[threading.Thread, int] = {}
        self.lock = threading.Lock()

    def started(self, **_: Any) -> None:
        thread = threading.current_thread()
        if thread is threading.main_thread():
            return
        with self.lock:
            self.open[thread] = self.open.get(thread, 0) + 1

    def finished(self, **_: Any) -> None:
        thread = threading.current_thread()
        with self.lock:
            if self.open.get(thread, 0) > 1:
                self.open[thread] -= 1
            else:
                self.open.pop(thread, None)

    @property
    def count(self) -> int:
        with self.lock:
            for thread in [t for t in self.open if not t.is_alive()]:
                del self.open[thread]
            return sum(self.open.values())

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


@pytest.fixture(autouse=True, scope="session")
def _fast_password_hashing() -> Iterator[None]:
    """Users made in this process hash their passwords with MD5, not PBKDF2's million rounds (half a
    second of CPU each; the API fixtures alone make five users a test). No test here is about the hash.
    Processes a test starts (gunicorn, the demo) keep the real hashers."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(autouse=True)
def _fresh_rate_counters() -> Iterator[None]:
    """Each test starts with no sign-in or token counts (tenants/counters.py keeps them in Redis, which a
    test's rollback does not undo; the database's own counters roll back with the test), and with no
    blind streak of the web tier (portal/middleware.py): one that an earlier test's shed or
    "unavailable" agent call left in this worker's cache would make a liveness check forgive silence."""
    from django.core.cache import caches
    from django.core.cache.backends.redis import RedisCache

    from portal.middleware import BLIND_LATEST_KEY, BLIND_SINCE_KEY

    cache = caches["default"]
    if isinstance(cache, RedisCache):
        try:
            client = cache._cache.get_client(None, write=True)
            keys = list(client.scan_iter(match=cache.make_key("yard:rate:*"), count=500))
            keys += [cache.make_key(BLIND_SINCE_KEY), cache.make_key(BLIND_LATEST_KEY)]
            client.delete(*keys)
        except Exception:  # Redis away: the fault tests that stop it count nothing here
            pass
    yield


@pytest.fixture(autouse=True)
def _no_cycle_due(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's first change asks for its own cycle: this process's note that one is already due
    (scheduling/services/common.py) would outlive the cache key that tests clear."""
    from scheduling.services import common

    monkeypatch.setattr(common, "_cycle_due", 0.0)


# Under pytest-xdist (`make test`), tests that share something costly run on one worker, one after
# another: the browser tests one Chromium and each other's CPU (their fleets and cycle threads, timed
# by what the page shows), the SSO tests their session's IdP (a Node process), a demo file its module's
# seeded demo. Everything else goes to whichever worker is free (--dist loadgroup).
XDIST_GROUPS = {
    "tests/browser/": "browser",
    "tests/sso/": "sso",
    "tests/demo/test_devserver.py": "demo-devserver",
    "tests/demo/test_sqlite_demo.py": "demo-sqlite",
    # Whole stacks (gunicorn, Celery, fleets) with their timings scaled down to seconds: one at a time
    # per group, so no more than two of them fight for the same two cores. The database outages (three
    # of about 100 s, mostly waiting out the outage) run beside the other faults (about four minutes).
    "tests/faults/test_database_outage.py": "faults-db",
    "tests/faults/": "faults",
    "tests/containers/": "containers",
    "tests/serving/test_live.py": "services-live",
    "tests/devsessions/test_live.py": "devsessions-live",
}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        for prefix, group in XDIST_GROUPS.items():
            if path.startswith(prefix):
                item.add_marker(pytest.mark.xdist_group(group))
                break
