"""`yard submit` always sends an Idempotency-Key, one per submission, kept across its retries: a
submission whose first answer is lost makes exactly one job.

The real `yard` console script against a live server, through a small HTTP proxy that forwards the
first POST /api/v1/jobs to the server, waits for the server's answer (the job is made) and then drops
the connection without passing it on, as a client timeout or a broken connection loses it."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from scheduling.models import Job
from tests.cli.conftest import Yard
from tests.factories import make_cluster


class LossyProxy:
    """Forwards every request to `upstream`; the first `lose` POSTs to /api/v1/jobs are forwarded and
    answered, but their answers never reach the client. Records the Idempotency-Key of each POST."""

    def __init__(self, upstream: str, *, lose: int = 1) -> None:
        self.upstream = upstream.rstrip("/")
        self.lose = lose
        self.keys: list[str | None] = []
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
                url = proxy.upstream + self.path
                request = urllib.request.Request(url, data=body or None, method=self.command, headers=headers)
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, answer_headers, payload = answer.status, answer.headers, answer.read()
                except urllib.error.HTTPError as exc:
                    status, answer_headers, payload = exc.code, exc.headers, exc.read()
                submit = self.command == "POST" and self.path.split("?")[0].rstrip("/") == "/api/v1/jobs"
                with proxy.lock:
                    if submit:
                        proxy.keys.append(self.headers.get("Idempotency-Key"))
                    drop = submit and proxy.lose > 0
                    proxy.lose -= 1 if drop else 0
                if drop:
                    self.close_connection = True  # the server made the job; its answer is lost
                    return
                self.send_response(status)
                for name, value in answer_headers.items():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = _forward

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def proxy(live_server: Any) -> Iterator[LossyProxy]:
    lossy = LossyProxy(live_server.url)
    yield lossy
    lossy.close()


@pytest.fixture
def yard_via_proxy(proxy: LossyProxy, cast: Any, roomy_throttle: None, tmp_path: Path) -> Yard:
    make_cluster(nodes=2)
    home = tmp_path / "config"
    home.mkdir()
    return Yard(url=proxy.url, token=cast.ann_token, home=home)


def test_a_submission_whose_first_answer_is_lost_makes_exactly_one_job(
    proxy: LossyProxy, yard_via_proxy: Yard, cast: Any
) -> None:
    done = yard_via_proxy.run("submit", "--team", cast.org.team_a.slug, "--gpus", "1", "--name", "once", "--", "true")
    assert done.returncode == 0, done.stdout + done.stderr
    assert Job.objects.filter(name="once").count() == 1
    assert "Submitted job" in done.stdout and "already submitted" not in done.stdout  # it is this submission's job
    # Two arrivals of one submission, with one key the CLI made itself.
    assert len(proxy.keys) == 2 and proxy.keys[0] is not None and proxy.keys[0] == proxy.keys[1]
    assert Job.objects.get(name="once").idempotency_key == proxy.keys[0]


def test_each_submission_has_its_own_key_and_a_given_key_is_kept(proxy: LossyProxy, yard_via_proxy: Yard, cast: Any) -> None:
    proxy.lose = 0
    team = cast.org.team_a.slug
    for _ in range(2):
        yard_via_proxy.run("submit", "--team", team, "--gpus", "1", "--name", "twice", "--", "true", check=True)
    assert Job.objects.filter(name="twice").count() == 2
    assert len(set(proxy.keys)) == 2 and None not in proxy.keys
    for _ in range(2):
        yard_via_proxy.run(
            "submit", "--team", team, "--gpus", "1", "--name", "ci", "--idempotency-key", "pipeline-7", "--", "true", check=True
        )
    assert Job.objects.filter(name="ci").count() == 1 and proxy.keys[-2:] == ["pipeline-7", "pipeline-7"]
