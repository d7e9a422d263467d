"""The zero-setup demo's web tier: gunicorn on SQLite (WAL, busy timeout, IMMEDIATE transactions).

Seen before: `sqlite3.OperationalError: database is locked` answered 500 to an agent's status call
under a handful of concurrent submits. Here submits and agent heartbeats arrive at once from many
client threads at a gunicorn of 2 x 4 threads, with DEBUG off and no SECRET_KEY set (the demo's
generated key), and nothing may answer 5xx.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.demo.helpers import (
    SHED,
    call,
    call_politely,
    gunicorn,
    job_body,
    manage,
    node_tokens,
    server_env,
    service_token,
    wait_for,
)

pytestmark = pytest.mark.slow
ACCESS = re.compile(r'"(?:GET|POST) (\S+) HTTP/[\d.]+" (\d{3}) \S+ (\d+)ms')


@dataclass
class Demo:
    url: str
    var: Path
    log: Path
    token: str
    nodes: list[str]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Demo]:
    var = tmp_path_factory.mktemp("sqlite-demo")
    env = server_env(var, YARD_TOKEN_THROTTLE="100000/minute")
    manage(env, "migrate", "--noinput", "-v0")
    manage(env, "seed_demo", "--agent-tokens", str(var / "agent-tokens.json"))
    manage(env, "collectstatic", "--noinput", "-v0")
    token = service_token(env)
    log = var / "gunicorn.log"
    with gunicorn(env, log) as url:
        yield Demo(url=url, var=var, log=log, token=token, nodes=list(node_tokens(var).values()))


def test_concurrent_submits_and_agent_calls_never_answer_5xx(demo: Demo) -> None:
    def one(i: int) -> tuple[str, int]:
        if i % 3 == 0:
            status, _ = call_politely("POST", f"{demo.url}/api/v1/jobs", token=demo.token, body=job_body(f"burst-{i}"))
            return "submit", status
        node = demo.nodes[i % len(demo.nodes)]
        status, _ = call_politely("POST", f"{demo.url}/api/agent/v1/heartbeat", token=node, body={"gpus": [], "tasks": []})
        return "heartbeat", status

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(one, range(240)))

    print(f"\n{len(results)} calls from 24 threads; {len(SHED)} shed with 503 overloaded and retried")
    assert sorted({r for r in results if r[1] >= 300}) == []
    assert not any(url.endswith("/heartbeat") for url in SHED)  # heartbeats are never shed
    assert {kind for kind, _ in results} == {"submit", "heartbeat"}
    assert "database is locked" not in demo.log.read_text()
    with sqlite3.connect(demo.var / "yardmaster.sqlite3") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_the_access_log_keeps_peoples_requests_and_drops_agents_heartbeats(demo: Demo) -> None:
    assert call("POST", f"{demo.url}/api/agent/v1/heartbeat", token=demo.nodes[0], body={})[0] == 200
    assert call("GET", f"{demo.url}/api/v1/jobs?marker=person", token=demo.token)[0] == 200
    assert call("POST", f"{demo.url}/api/agent/v1/heartbeat", token="ynd_not-a-token", body={})[0] == 401
    assert call("GET", f"{demo.url}/static/admin/css/base.css")[0] == 200  # WhiteNoise, no runserver

    def access() -> list[tuple[str, int, int]]:
        """(path, status, milliseconds) of each access line (portal/gunicorn.conf.py's format)."""
        return [(m[1], int(m[2]), int(m[3])) for m in ACCESS.finditer(demo.log.read_text())]

    def logged() -> bool:  # each request's line; the workers of gunicorn write them in their own time
        lines = access()
        return (
            any("marker=person" in path for path, _, _ in lines)
            and any(path == "/api/agent/v1/heartbeat" and status == 401 for path, status, _ in lines)
            and any(path == "/static/admin/css/base.css" for path, _, _ in lines)
        )

    wait_for("the person's request, the refused heartbeat and the static file in the log", logged)
    heartbeats = [(status, ms) for path, status, ms in access() if path == "/api/agent/v1/heartbeat"]
    # The refused one is there (and any slow one: a loaded machine makes some); none that went well and fast.
    assert any(status == 401 for status, _ in heartbeats)
    assert [(status, ms) for status, ms in heartbeats if status < 400 and ms < 1000] == []
    assert any(path == "/static/admin/css/base.css" for path, _, _ in access())
