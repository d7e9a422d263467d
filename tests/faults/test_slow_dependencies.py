"""A slow, half-open or dead dependency makes the web tier slower or answer 503, never hang or 500.

The portal's processes (gunicorn, a Celery worker and beat, as bench/stack.py runs them) reach
PostgreSQL through a TCP proxy (tests/faults/proxy.py) with the database bounds scaled down
(connect_timeout 2 s, tcp_user_timeout 3 s, statement_timeout 5 s, client deadline 6 s):

- half-open (the proxy accepts and acknowledges, forwards nothing) for 20 s: before, every gunicorn
  thread blocked on its pooled connection for good and the web tier stayed hung after the database
  came back; now each request answers 503 JSON within the bounds and the portal serves again seconds
  after the proxy forwards again;
- 1 s added to every round trip: requests are slower and answered (200 or 503), none hangs, none 500s;
- Redis (its own redis-server here) killed: token API requests answer without a 500 and /healthz says
  which dependency is gone, then ok once Redis is back.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import bench.stack
from bench.stack import PG, Stack
from tests.faults.proxy import TcpProxy

pytestmark = [pytest.mark.slow]

BOUNDS = {
    "YARD_DB_CONNECT_TIMEOUT_S": "2",
    "YARD_DB_TCP_USER_TIMEOUT_MS": "3000",
    "YARD_DB_STATEMENT_TIMEOUT_MS": "5000",
    "YARD_DB_CLIENT_TIMEOUT_S": "6",
}
# What one request may take while the database hangs: a pooled connection's health check runs into the
# client deadline, then a new connection into connect_timeout; twice that, for a loaded 2-core machine.
HANG_BOUND_S = 2 * (float(BOUNDS["YARD_DB_CLIENT_TIMEOUT_S"]) + float(BOUNDS["YARD_DB_CONNECT_TIMEOUT_S"]))
CLIENT_TIMEOUT_S = 60.0  # far beyond any bound: a request that takes this long has hung
# Every thread takes a request (no admission bound, portal/middleware.py): what is measured here is
# each request's own bound on the database, not the shedding of what finds the threads busy.
WEB = {"YARD_WEB_WORKERS": "2", "YARD_WEB_THREADS": "4", "YARD_WEB_INFLIGHT": "4"}
THREADS = 8  # as many concurrent requests as the web tier has threads: every pooled connection is hit


def _get(url: str, token: str | None = None) -> tuple[int, dict[str, str], Any, float]:
    """(status, headers, parsed body, seconds); status 0 when no answer came within CLIENT_TIMEOUT_S."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=CLIENT_TIMEOUT_S) as response:
            status, headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    except OSError as exc:
        return 0, {}, str(exc), time.monotonic() - started
    elapsed = time.monotonic() - started
    try:
        return status, headers, json.loads(raw or b"{}"), elapsed
    except ValueError:
        return status, headers, {"not_json": raw[:200].decode(errors="replace")}, elapsed


def _burst(stack: Stack, path: str = "/api/v1/jobs") -> list[tuple[int, dict[str, str], Any, float]]:
    with ThreadPoolExecutor(THREADS) as pool:
        return list(pool.map(lambda _: _get(stack.url + path, stack.token), range(THREADS)))


def _wait_all_ok(stack: Stack, *, timeout: float) -> float:
    """Seconds until a whole burst answers 200 (every web thread serves again)."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        answers = _burst(stack)
        if all(status == 200 for status, *_ in answers):
            return time.monotonic() - started
        assert time.monotonic() < deadline, f"not recovered after {timeout:.0f} s: {[a[:1] + a[2:3] for a in answers]}"
        time.sleep(0.2)


def _summary(answers: list[tuple[int, dict[str, str], Any, float]]) -> str:
    times = sorted(elapsed for *_, elapsed in answers)
    statuses: dict[int, int] = {}
    for status, *_ in answers:
        statuses[status] = statuses.get(status, 0) + 1
    return f"{len(answers)} requests, statuses {statuses}, p50 {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s"


@pytest.fixture
def private_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stacks use this run's Redis database (REDIS_URL), not the bench's shared one."""
    if os.environ.get("REDIS_URL"):
        monkeypatch.setattr(bench.stack, "REDIS", os.environ["REDIS_URL"])


@pytest.fixture
def proxied(private_redis: None) -> Iterator[tuple[TcpProxy, Stack]]:
    host, port = "127.0.0.1", int(PG.rsplit(":", 1)[1].split("/")[0])
    with TcpProxy(target=(host, port)) as proxy:
        portal_pg = f"postgres://postgres@127.0.0.1:{proxy.port}"
        with Stack(nodes=1, agents=False, extra_env={**BOUNDS, **WEB}, portal_pg=portal_pg) as stack:
            yield proxy, stack


def test_the_libpq_bounds_are_on_the_portal_connections_socket(proxied: tuple[TcpProxy, Stack]) -> None:
    """What the test below relies on, read back from a real connection: keepalives and tcp_user_timeout
    on the socket, statement_timeout in the session."""
    _, stack = proxied
    out = stack.django(
        "import socket\n"
        "from django.db import connection\n"
        "connection.ensure_connection()\n"
        "s = socket.socket(fileno=__import__('os').dup(connection.connection.pgconn.socket))\n"
        "print(s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),"
        " s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL), s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),"
        " s.getsockopt(socket.IPPROTO_TCP, 18))\n"  # 18: TCP_USER_TIMEOUT
        "s.detach()\n"
        "with connection.cursor() as c:\n"
        "    c.execute('SHOW statement_timeout'); print(c.fetchone()[0], type(connection.connection).__name__)\n"
    )
    sockopts, session = out.strip().splitlines()[-2:]
    print(f"socket: keepalive, idle, interval, count, user timeout = {sockopts}; session: {session}")
    assert sockopts.split() == ["1", "10", "5", "3", "3000"]
    assert session.split() == ["5s", "BoundedConnection"]


def test_a_half_open_database_answers_503_fast_and_the_web_tier_recovers_by_itself(
    proxied: tuple[TcpProxy, Stack],
) -> None:
    proxy, stack = proxied
    assert all(status == 200 for status, *_ in _burst(stack))  # every thread holds a pooled connection

    proxy.hang()
    hung_at = time.monotonic()
    during: list[tuple[int, dict[str, str], Any, float]] = []
    while time.monotonic() - hung_at < 20:
        during += _burst(stack)
    health = _get(stack.url + "/healthz")
    hung_for = time.monotonic() - hung_at
    proxy.restore()
    recovered_s = _wait_all_ok(stack, timeout=60)

    slowest = max(elapsed for *_, elapsed in during)
    print(
        f"half-open database for {hung_for:.0f} s ({proxy.dropped_bytes} bytes swallowed): {_summary(during)} "
        f"(bound {HANG_BOUND_S:.0f} s); /healthz {health[0]} in {health[3]:.1f} s; "
        f"every web thread served again {recovered_s:.1f} s after the database came back"
    )
    assert {status for status, *_ in during} == {503}, _summary(during)
    assert all(body.get("code", "").startswith("unavailable") and headers.get("Retry-After") for _, headers, body, _ in during)
    assert slowest <= HANG_BOUND_S, _summary(during)
    assert health[0] == 503 and health[2]["database"].startswith("error")


def test_a_slow_database_makes_requests_slower_never_hung_never_500(proxied: tuple[TcpProxy, Stack]) -> None:
    proxy, stack = proxied
    fast = _burst(stack)
    proxy.delay_s = 1.0
    slow_at = time.monotonic()
    during: list[tuple[int, dict[str, str], Any, float]] = []
    while time.monotonic() - slow_at < 20:
        during += _burst(stack)
    proxy.delay_s = 0.0
    recovered_s = _wait_all_ok(stack, timeout=60)
    print(
        f"1 s per database round trip for {time.monotonic() - slow_at - recovered_s:.0f} s: {_summary(during)}; "
        f"before: {_summary(fast)}; all 200 again {recovered_s:.1f} s after"
    )
    assert {status for status, *_ in during} <= {200, 503}, _summary(during)
    assert any(status == 200 for status, *_ in during)  # slower, still served


def _redis_server(port: int, log: Path) -> subprocess.Popen[bytes]:
    out = open(log, "ab")  # noqa: SIM115 - the child holds it
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 20
    while True:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process
        assert process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
def test_a_redis_outage_never_turns_a_request_into_a_500(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port = bench.stack.free_port()
    redis_url = f"redis://127.0.0.1:{port}/0"
    server = _redis_server(port, tmp_path / "redis.log")
    try:
        monkeypatch.setattr(bench.stack, "REDIS", redis_url)
        with Stack(nodes=1, agents=False, extra_env={**BOUNDS, **WEB}) as stack:
            before = _burst(stack)
            assert {status for status, *_ in before} == {200}, _summary(before)
            assert _get(stack.url + "/healthz")[2] == {"status": "ok", "database": "ok", "cache": "ok", "broker": "ok"}

            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            down_at = time.monotonic()
            during: list[tuple[int, dict[str, str], Any, float]] = []
            while time.monotonic() - down_at < 10 and len(during) < 200:
                during += _burst(stack)
            health = _get(stack.url + "/healthz")

            server = _redis_server(port, tmp_path / "redis.log")
            back_at = time.monotonic()
            deadline = back_at + 30
            while (after := _get(stack.url + "/healthz"))[2].get("cache") != "ok":
                assert time.monotonic() < deadline, after
                time.sleep(0.2)
            print(
                f"Redis killed for {back_at - down_at:.0f} s: token API {_summary(during)}; /healthz {health[0]} {health[2]} "
                f"in {health[3]:.1f} s; cache ok again {time.monotonic() - back_at:.1f} s after Redis returned"
            )
            assert all(status in (200, 503) for status, *_ in during), _summary(during)
            assert all(isinstance(body, dict) and "not_json" not in body for _, _, body, _ in during)
            assert health[0] == 200 and health[2]["database"] == "ok" and health[2]["status"] == "degraded"
            assert health[2]["cache"].startswith("error") and health[2]["broker"].startswith("error")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
