"""The service proxy (portal/service_proxy.py) as it runs: the portal's ASGI app under a real uvicorn on a
loopback port, in front of two real HTTP servers standing in for a service's replicas, with the service,
its token and its replica jobs in the real database. Who may call, where requests go (balanced, never to
a replica that is not ready, retried elsewhere when one refuses the connection), that streams arrive as
they are sent, and what it writes into ServiceWindow."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import secrets
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import httpx
import pytest
import uvicorn
from django.db import OperationalError
from django.test import Client
from django.utils import timezone

from portal import asgi, service_proxy
from portal.notebook_proxy import NotebookProxy
from portal.service_proxy import ServiceProxy
from scheduling.models import Job, JobKind, Node, Service, ServiceToken, ServiceWindow, Task
from scheduling.serving.selectors import service_stats
from scheduling.states import JobState
from tests.factories import make_job
from tests.portal.notebook_servers import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WINDOW_S = 1.0


# --------------------------------------------------------------------------- the replicas


@dataclass
class Replica:
    """A real HTTP server on a loopback port, counting what it was sent."""

    name: str
    server: http.server.ThreadingHTTPServer
    hits: list[str] = field(default_factory=list)
    seen: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)  # the stream's last event waits on it
    job: Job | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_replica(name: str) -> Replica:
    replica: Replica

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")  # a stopped server then has no connection left to serve
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            replica.hits.append(self.path)
            replica.seen.append({k.lower(): v for k, v in self.headers.items()})
            if self.path.startswith("/slow"):
                time.sleep(0.02)
            if self.path.startswith("/fail"):
                self._answer(500, {"replica": replica.name})
            elif self.path.startswith("/abort"):
                self.close_connection = True  # no answer at all: the connection just ends
            elif self.path.startswith("/stream"):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.send_header("Connection", "close")
                self.end_headers()
                self._chunk(b"data: first\n\n")
                replica.release.wait(timeout=10)
                self._chunk(b"data: last\n\n")
                self.wfile.write(b"0\r\n\r\n")
            else:
                self._answer(200, {"replica": replica.name, "path": self.path})

        def do_POST(self) -> None:
            replica.hits.append(self.path)
            replica.seen.append({k.lower(): v for k, v in self.headers.items()})
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                body = b""
                while (size := int(self.rfile.readline().strip(), 16)) > 0:
                    body += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
            else:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            replica.bodies.append(body)
            if self.path.startswith("/abort"):
                self.close_connection = True  # no answer at all: the connection just ends
                return
            self._answer(200, {"replica": replica.name, "size": len(body)})

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    replica = Replica(name=name, server=server)
    threading.Thread(target=server.serve_forever, name=f"replica-{name}", daemon=True).start()
    return replica


def replica_job(service: Service, replica: Replica, *, ready: bool = True) -> Job:
    """A RUNNING replica job of ``service`` whose rank 0 reports ``replica``'s URL, as the agent would."""
    job = make_job(
        team=service.team,
        user=service.user,
        kind=JobKind.SERVICE,
        state=JobState.RUNNING,
        service=service,
        service_revision=1,
        time_limit_s=0,
        name=f"{service.name}-{replica.name}",
    )
    Task.objects.create(
        job=job, attempt=1, rank=0, node=Node.objects.first(), state="RUNNING", service_ready=ready, service_url=replica.url
    )
    replica.job = job
    return job


# --------------------------------------------------------------------------- the proxy


@dataclass
class Stack:
    url: str  # the proxy's
    service: Service
    token: str
    one: Replica
    two: Replica
    proxy: ServiceProxy

    @property
    def base(self) -> str:
        return f"{self.url}/services/{self.service.team.slug}/{self.service.name}"

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def make_token(service: Service) -> str:
    raw = "ysv_" + secrets.token_urlsafe(24)
    ServiceToken.objects.create(service=service, name="ci", prefix=raw[:12], token_hash=hashlib.sha256(raw.encode()).hexdigest())
    return raw


@pytest.fixture
def stack(cast: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[Stack]:
    settings.YARD = {**settings.YARD, "SERVICE_WINDOW_S": WINDOW_S}
    monkeypatch.setattr(service_proxy, "ROUTES_TTL_S", 0.2)  # a change in the database shows at once
    monkeypatch.setattr(service_proxy, "AUTH_CACHE_S", 0.0)
    service = Service.objects.create(name="echo", team=cast.org.team_a, user=cast.ann, gpu_type="H100", replicas=2)
    token = make_token(service)
    one, two = start_replica("one"), start_replica("two")
    replica_job(service, one)
    replica_job(service, two)
    # A proxy of its own per test (fresh caches and counters), around the portal's own notebook proxy and Django.
    proxy = ServiceProxy(asgi.application.app)
    port = free_port()
    config = uvicorn.Config(proxy, host="127.0.0.1", port=port, lifespan="on", log_level="warning")  # type: ignore[arg-type]
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="service-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the proxy did not start"
        time.sleep(0.05)
    try:
        yield Stack(url=f"http://127.0.0.1:{port}", service=service, token=token, one=one, two=two, proxy=proxy)
    finally:
        one.release.set()
        two.release.set()
        server.should_exit = True
        thread.join(timeout=15)
        for replica in (one, two):
            with contextlib.suppress(OSError):  # a test may have stopped it already
                replica.stop()


def session_of(user: Any) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {"sessionid": client.cookies["sessionid"].value}


# --------------------------------------------------------------------------- who may call


def test_the_portal_serves_services_in_front_of_notebooks_and_django():
    assert isinstance(asgi.application, ServiceProxy)
    assert isinstance(asgi.application.app, NotebookProxy)


def test_a_service_token_reaches_a_replica_which_sees_neither_it_nor_the_portals_cookies(stack, cast):
    cookies = {**session_of(cast.ann), "csrftoken": "portal-csrf", "theirs": "kept"}
    answer = httpx.get(f"{stack.base}/v1/models?x=1", headers=stack.auth(), cookies=cookies)
    assert answer.status_code == 200, answer.text
    assert answer.json()["path"] == "/v1/models?x=1"
    seen = (stack.one.seen + stack.two.seen)[-1]
    assert "authorization" not in seen
    assert seen.get("cookie") == "theirs=kept"
    assert seen["x-forwarded-prefix"] == "/services/team-a/echo"
    assert seen["x-forwarded-for"] == "127.0.0.1"
    assert seen["x-forwarded-proto"] == "http"
    assert seen["x-forwarded-host"] == stack.url.removeprefix("http://")


def test_without_credentials_or_with_a_bad_or_revoked_token_the_answer_is_401(stack):
    assert httpx.get(f"{stack.base}/x").status_code == 401
    wrong = httpx.get(f"{stack.base}/x", headers={"Authorization": "Bearer ysv_not-a-token"})
    assert wrong.status_code == 401 and "detail" in wrong.json()
    assert httpx.get(f"{stack.base}/x", headers={"Authorization": f"Basic {stack.token}"}).status_code == 401
    # A token of this service on another (or a missing) one is no better than a wrong one: nothing is revealed.
    assert httpx.get(f"{stack.url}/services/team-a/nope/x", headers=stack.auth()).status_code == 401
    assert httpx.get(f"{stack.base}/x", headers=stack.auth()).status_code == 200
    ServiceToken.objects.filter(service=stack.service).update(revoked_at=timezone.now())
    time.sleep(0.3)  # the proxy's cached routes (and token hashes) are ROUTES_TTL_S old at most
    assert httpx.get(f"{stack.base}/x", headers=stack.auth()).status_code == 401
    assert stack.one.hits + stack.two.hits == ["/x"]


def test_a_team_members_session_may_call_it_another_teams_user_gets_the_same_404_as_a_missing_service(stack, cast):
    assert httpx.get(f"{stack.base}/x", cookies=session_of(cast.ann)).status_code == 200
    outsider = session_of(cast.zed)
    refused = httpx.get(f"{stack.base}/x", cookies=outsider)
    missing = httpx.get(f"{stack.url}/services/team-a/nope/x", cookies=outsider)
    assert refused.status_code == missing.status_code == 404
    assert refused.json() == missing.json()
    assert httpx.get(f"{stack.base}/x", cookies={"sessionid": "ended"}).status_code == 401
    assert len(stack.one.hits + stack.two.hits) == 1


def test_another_site_cannot_post_through_a_portal_session(stack, cast):
    cookies = session_of(cast.ann)
    evil = httpx.post(f"{stack.base}/x", content=b"{}", cookies=cookies, headers={"Origin": "https://evil.example"})
    assert evil.status_code == 403
    own = httpx.post(f"{stack.base}/x", content=b"{}", cookies=cookies, headers={"Origin": stack.url})
    assert own.status_code == 200


# --------------------------------------------------------------------------- where requests go


def test_requests_are_spread_over_both_ready_replicas(stack):
    with httpx.Client(headers=stack.auth()) as client:
        for _ in range(20):
            assert client.get(f"{stack.base}/x").status_code == 200
    # One at a time, both have none in flight: round-robin between the two.
    assert len(stack.one.hits) == len(stack.two.hits) == 10


def test_concurrent_requests_go_to_the_replica_with_fewer_in_flight(stack):
    import concurrent.futures

    with httpx.Client(headers=stack.auth()) as client, concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.get(f"{stack.base}/slow").status_code, range(40)))
    assert answers == [200] * 40
    assert 10 <= len(stack.one.hits) <= 30 and len(stack.one.hits) + len(stack.two.hits) == 40


def test_a_body_streams_up_whole_known_size_or_chunked(stack):
    payload = secrets.token_bytes(300_000)
    answer = httpx.post(f"{stack.base}/upload", content=payload, headers=stack.auth())
    assert answer.status_code == 200 and answer.json()["size"] == len(payload)

    def pieces() -> Iterator[bytes]:
        for i in range(0, len(payload), 65_536):
            yield payload[i : i + 65_536]

    chunked = httpx.post(f"{stack.base}/upload", content=pieces(), headers=stack.auth())
    assert chunked.status_code == 200 and chunked.json()["size"] == len(payload)
    assert (stack.one.bodies + stack.two.bodies) == [payload, payload]


def test_a_replica_whose_server_is_gone_costs_no_request(stack):
    stack.two.stop()  # connection refused from now on; the database still says it is ready
    with httpx.Client(headers=stack.auth()) as client:
        answers = [client.post(f"{stack.base}/generate", content=b"{}").status_code for _ in range(20)]
    assert answers == [200] * 20  # the refused ones were sent to the other (a POST too: it was never sent)
    assert len(stack.one.hits) == 20


def test_a_replica_that_is_not_ready_gets_nothing(stack):
    Task.objects.filter(job=stack.two.job).update(service_ready=False)
    time.sleep(0.3)
    with httpx.Client(headers=stack.auth()) as client:
        assert [client.get(f"{stack.base}/x").status_code for _ in range(10)] == [200] * 10
    assert len(stack.one.hits) == 10 and stack.two.hits == []


def test_a_draining_replica_leaves_the_rotation_within_a_second(stack, monkeypatch):
    monkeypatch.setattr(service_proxy, "ROUTES_TTL_S", 1.0)  # the shipped value
    with httpx.Client(headers=stack.auth()) as client:
        assert client.get(f"{stack.base}/x").status_code == 200
        Job.objects.filter(pk=stack.two.job.pk).update(drain_started_at=timezone.now())
        time.sleep(1.1)
        before = len(stack.two.hits)
        assert [client.get(f"{stack.base}/x").status_code for _ in range(10)] == [200] * 10
    assert len(stack.two.hits) == before


def test_with_no_ready_replica_the_answer_is_503_with_retry_after(stack):
    Task.objects.filter(job__service=stack.service).update(service_ready=False)
    time.sleep(0.3)
    answer = httpx.get(f"{stack.base}/x", headers=stack.auth())
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert "2 replicas" in answer.json()["detail"]


def test_every_replica_refusing_is_503_not_a_resent_request(stack):
    stack.one.stop()
    stack.two.stop()
    answer = httpx.post(f"{stack.base}/x", content=b"{}", headers=stack.auth())
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"


def test_a_replica_that_breaks_off_a_post_is_a_502_and_it_is_not_resent(stack):
    answer = httpx.post(f"{stack.base}/abort", headers=stack.auth(), content=b"{}")
    assert answer.status_code == 502 and "detail" in answer.json()
    assert len(stack.one.hits + stack.two.hits) == 1


def test_a_get_whose_connection_breaks_before_any_answer_goes_to_another_replica_once_each(stack):
    # What a kept-alive connection to a replica killed since looks like; a GET may be sent twice (nginx's
    # proxy_next_upstream), at most once per replica.
    answer = httpx.get(f"{stack.base}/abort", headers=stack.auth())
    assert answer.status_code == 503 and "detail" in answer.json()
    assert sorted(stack.one.hits + stack.two.hits) == ["/abort", "/abort"]


def test_a_database_that_cannot_be_read_is_a_503_never_a_500(stack, monkeypatch):
    def down(team: str, name: str) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr(service_proxy, "_routes_sync", down)
    answer = httpx.get(f"{stack.url}/services/team-a/other/x", headers=stack.auth())  # nothing cached for it
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"


# --------------------------------------------------------------------------- streaming


def test_server_sent_events_arrive_as_they_are_sent(stack):
    with httpx.stream("GET", f"{stack.base}/stream", headers=stack.auth(), timeout=5) as answer:
        assert answer.status_code == 200 and answer.headers["content-type"] == "text/event-stream"
        chunks = answer.iter_raw()
        first = next(chunks)
        # The replica has sent only its first event and waits for us: a buffering proxy would hang here.
        assert first == b"data: first\n\n"
        for replica in (stack.one, stack.two):
            replica.release.set()
        rest = b"".join(chunks)
    assert rest == b"data: last\n\n"


def test_a_caller_that_leaves_a_stream_is_no_longer_in_flight(stack):
    with httpx.stream("GET", f"{stack.base}/stream", headers=stack.auth(), timeout=5) as answer:
        chunks = answer.iter_raw()  # held: a generator dropped here would close the connection when collected
        assert next(chunks) == b"data: first\n\n"
        assert sum(stack.proxy._inflight.values()) == 1
    # Gone before the replica's last event: the proxy stops reading it rather than stream to nobody.
    deadline = time.monotonic() + 3
    while stack.proxy._inflight:
        assert time.monotonic() < deadline, stack.proxy._inflight
        time.sleep(0.05)
    assert not stack.one.release.is_set() and not stack.two.release.is_set()


def test_a_websocket_to_a_service_is_refused_in_the_handshake(stack):
    import websockets.sync.client

    with pytest.raises(websockets.InvalidStatus) as refused:
        websockets.sync.client.connect(f"{stack.base.replace('http://', 'ws://')}/ws", additional_headers=stack.auth())
    assert refused.value.response.status_code == 403


# --------------------------------------------------------------------------- what it measured


def test_each_window_is_written_with_its_requests_errors_and_latency(stack):
    with httpx.Client(headers=stack.auth()) as client:
        for _ in range(30):
            assert client.get(f"{stack.base}/slow").status_code == 200
        for _ in range(4):
            assert client.get(f"{stack.base}/fail").status_code == 500
    Task.objects.filter(job__service=stack.service).update(service_ready=False)
    time.sleep(0.3)
    assert httpx.get(f"{stack.base}/x", headers=stack.auth()).status_code == 503  # the proxy's own error counts
    deadline = time.monotonic() + 3 * WINDOW_S + 2
    while sum(ServiceWindow.objects.filter(service=stack.service).values_list("requests", flat=True)) < 35:
        assert time.monotonic() < deadline, "the windows were not written"
        time.sleep(0.1)
    windows = list(ServiceWindow.objects.filter(service=stack.service))
    assert ServiceToken.objects.get(service=stack.service).last_used_at is not None  # written with the windows
    assert {w.source for w in windows} == {stack.proxy.source}
    assert all(w.start.timestamp() % WINDOW_S == 0 for w in windows)  # aligned on multiples of the window
    stats = service_stats(service=stack.service, seconds=60, now=timezone.now() + timedelta(seconds=WINDOW_S))
    assert stats.requests == 35 and stats.errors == 5
    assert stats.p50_ms is not None and stats.p99_ms is not None
    assert 20 <= stats.p50_ms <= 500 and stats.p50_ms <= stats.p99_ms <= 5000
    per = stats.per_replica
    assert set(per) == {stack.one.job.pk, stack.two.job.pk}  # the 503 was sent nowhere
    assert sum(r["requests"] for r in per.values()) == 34
    assert stats.inflight > 0


def test_a_request_that_outlasts_its_window_counts_in_the_window_it_ends_in(stack):
    with httpx.stream("GET", f"{stack.base}/stream", headers=stack.auth(), timeout=5) as answer:
        chunks = answer.iter_raw()
        began = time.time()
        next(chunks)
        time.sleep(WINDOW_S * 1.5)  # past the end of the window it began in
        stack.one.release.set()
        stack.two.release.set()
        b"".join(chunks)
    ended = time.time()
    deadline = time.monotonic() + 2 * WINDOW_S + 2
    while not ServiceWindow.objects.filter(service=stack.service).exists():
        assert time.monotonic() < deadline, "the window was not written"
        time.sleep(0.1)
    (window,) = ServiceWindow.objects.filter(service=stack.service)
    assert window.start.timestamp() > began  # not the window it began in...
    assert window.start.timestamp() <= ended < window.start.timestamp() + WINDOW_S  # ...the one it ended in
    assert window.requests == 1 and window.busy_s >= WINDOW_S * 1.5
