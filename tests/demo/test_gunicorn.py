"""gunicorn with the project's config: database connections stay bounded, agents stay out of the log.

`make run` used to serve with runserver, a thread per request, each keeping its own PostgreSQL
connection (CONN_MAX_AGE): 60 heartbeats left 17-23 connections open and a run exhausted a 100-connection
server. Under gunicorn's gthread workers a fixed pool of threads serves every request, so at most
workers x threads connections are ever open, whatever the number of requests.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from tests.demo.helpers import call_politely, gunicorn, manage, node_tokens, server_env, service_token

pytestmark = pytest.mark.slow
WORKERS, THREADS = 2, 4
REQUESTS, CLIENT_THREADS = 200, 16
RETRIED = ("overloaded", "unavailable")  # as the CLI and the agents retry (any 503 the portal answers)


def _server_url(url: str, dbname: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{dbname}"))


@pytest.fixture
def throwaway_database() -> Iterator[str]:
    """A database of its own on the tests' PostgreSQL server (not pytest-django's): its URL."""
    base = os.environ["DATABASE_URL"]
    name = f"yard_gunicorn_{uuid.uuid4().hex[:10]}"
    admin = _server_url(base, "postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _server_url(base, name)
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _connections(admin_url: str, dbname: str) -> int:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)).fetchone()
    return int(row[0]) if row else 0


def test_many_requests_open_at_most_workers_times_threads_connections(throwaway_database: str, tmp_path: Path) -> None:
    env = server_env(
        tmp_path,
        DATABASE_URL=throwaway_database,
        REDIS_URL=os.environ["REDIS_URL"],
        SECRET_KEY=os.environ["SECRET_KEY"],
        ALLOWED_HOSTS="127.0.0.1",
        YARD_WEB_WORKERS=str(WORKERS),
        YARD_WEB_THREADS=str(THREADS),
        YARD_TOKEN_THROTTLE="100000/minute",
    )
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "seed_demo", "--agent-tokens", str(tmp_path / "agent-tokens.json"))
    token = service_token(env)
    nodes = list(node_tokens(tmp_path).values())
    dbname = urlsplit(throwaway_database).path.lstrip("/")
    admin = _server_url(os.environ["DATABASE_URL"], "postgres")

    with gunicorn(env, tmp_path / "gunicorn.log") as url:
        peak = 0
        done = threading.Event()

        def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, _connections(admin, dbname))
                done.wait(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()

        def one(i: int) -> int:
            # Users' reads and agents' heartbeats (each a database write), as the demo's traffic is.
            if i % 2:
                return call_politely("GET", f"{url}/api/v1/jobs", token=token, retry=RETRIED)[0]
            # A shed heartbeat (503 "overloaded") or one that waited past its database budget (503
            # "unavailable") is an answer: the agent counts it as blind and beats again. This test counts
            # connections; that the web tier answers those 503s fast is tests/faults'.
            beat = {"gpus": [], "tasks": []}
            node = nodes[i % len(nodes)]
            return call_politely("POST", f"{url}/api/agent/v1/heartbeat", token=node, body=beat, retry=RETRIED)[0]

        try:
            with ThreadPoolExecutor(CLIENT_THREADS) as pool:
                statuses = list(pool.map(one, range(REQUESTS)))
            after = _connections(admin, dbname)
        finally:
            done.set()
            sampler.join()

    assert sorted(set(statuses)) == [200]
    assert 0 < peak <= WORKERS * THREADS, f"peak {peak} connections"
    assert after <= WORKERS * THREADS
