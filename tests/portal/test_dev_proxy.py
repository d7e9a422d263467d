"""The dev-session tunnel (portal/dev_proxy.py): the real ASGI app under uvicorn on a loopback port, a real
TCP echo server standing in for the session's sshd, and the session's job and task rows in PostgreSQL.

Only the owner, signed in or with a personal API token, while the session runs, gets a tunnel; everyone
and everything else gets the one same refusal; a session that stops while connected is cut."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from django.test import Client
from django.utils import timezone

from portal import dev_proxy
from portal.dev_proxy import Endpoint, parse_endpoint
from scheduling.models import Gpu, Job, JobKind, Task
from scheduling.states import JobState
from tenants.services import token_create_personal, token_create_service
from tests.factories import make_job
from tests.portal.notebook_servers import free_port, proxy_server

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run_async(coroutine: Any) -> Any:
    """``asyncio.run`` in a thread of its own (a session-wide Playwright may hold this thread's loop)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=60)


class _Echo(socketserver.BaseRequestHandler):
    ended: threading.Event

    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)
        type(self).ended.set()


@pytest.fixture
def echo() -> Iterator[tuple[int, threading.Event]]:
    """A TCP echo server on loopback (the sshd's stand-in); the event is set when a connection to it ends."""
    ended = threading.Event()
    handler = type("Echo", (_Echo,), {"ended": ended})
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], ended
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxy(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
    monkeypatch.setattr(dev_proxy, "RECHECK_S", 0.3)
    with proxy_server() as url:
        settings.YARD_NOTEBOOK_URL = url
        yield url


def dev_session(*, team: Any, user: Any, endpoint: str, state: str = JobState.RUNNING) -> Job:
    job = make_job(team=team, user=user, kind=JobKind.DEV, state=state, command="")
    node = Gpu.objects.first().node  # type: ignore[union-attr]
    Task.objects.create(job=job, attempt=1, rank=0, node=node, state="RUNNING", dev_endpoint=endpoint)
    return job


@pytest.fixture
def session(cast: Any, echo: tuple[int, threading.Event]) -> Job:
    return dev_session(team=cast.org.team_a, user=cast.ann, endpoint=f"127.0.0.1:{echo[0]}")


def ws_url(proxy: str, pk: int) -> str:
    return f"{proxy.replace('http://', 'ws://')}/dev-sessions/{pk}/ssh"


def bearer(user: Any) -> dict[str, str]:
    return {"Authorization": f"Bearer {token_create_personal(user=user, name='cli', expires_at=None).raw}"}


def cookie_of(user: Any) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}


async def round_trip(url: str, headers: dict[str, str], payload: bytes) -> bytes:
    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        got = b""
        for start in range(0, len(payload), 50_000):
            await ws.send(payload[start : start + 50_000])
        while len(got) < len(payload):
            frame = await asyncio.wait_for(ws.recv(), timeout=10)
            assert isinstance(frame, bytes)
            got += frame
        return got


async def refusal(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    try:
        async with websockets.connect(url, additional_headers=headers):
            return 101, b""
    except websockets.InvalidStatus as exc:
        return exc.response.status_code, exc.response.body or b""


def test_the_owners_token_gets_a_tunnel_and_bytes_round_trip(proxy, cast, session, echo):
    payload = bytes(range(256)) * 1000  # every byte value, 256 kB: several frames each way
    assert run_async(round_trip(ws_url(proxy, session.pk), bearer(cast.ann), payload)) == payload
    assert echo[1].wait(5), "the tunnel's TCP connection outlived the websocket"


def test_the_owners_portal_session_gets_a_tunnel_too(proxy, cast, session):
    headers = {**cookie_of(cast.ann), "Origin": proxy}  # a browser's, from the portal's own origin
    assert run_async(round_trip(ws_url(proxy, session.pk), headers, b"SSH-2.0-test\r\n")) == b"SSH-2.0-test\r\n"


def test_everyone_else_is_refused_the_same_way(proxy, cast, session, echo):
    url = ws_url(proxy, session.pk)
    stopped = dev_session(team=cast.org.team_a, user=cast.ann, endpoint=f"127.0.0.1:{echo[0]}", state=JobState.COMPLETED)
    notebook = make_job(team=cast.org.team_a, user=cast.ann, kind=JobKind.NOTEBOOK, state=JobState.RUNNING, command="")
    Task.objects.create(
        job=notebook, attempt=1, rank=0, node=Gpu.objects.first().node, state="RUNNING", dev_endpoint=f"127.0.0.1:{echo[0]}"
    )  # type: ignore[union-attr]
    unreported = dev_session(team=cast.org.team_a, user=cast.ann, endpoint="")
    service_account = token_create_service(actor=None, team=cast.org.team_a, name="ci", expires_at=None).raw
    owner = bearer(cast.ann)
    cases = {
        "the team lead": (url, bearer(cast.lea)),
        "an admin": (url, bearer(cast.cat)),
        "another team's member": (url, bearer(cast.ben)),
        "the team's service account": (url, {"Authorization": f"Bearer {service_account}"}),
        "no credentials": (url, {}),
        "a made-up token": (url, {"Authorization": "Bearer ym_not-a-token"}),
        "another's portal session": (url, cookie_of(cast.ben)),
        "a stopped session": (ws_url(proxy, stopped.pk), owner),
        "a missing session": (ws_url(proxy, 987654321), owner),
        "a notebook": (ws_url(proxy, notebook.pk), owner),
        "a session whose sshd has not reported": (ws_url(proxy, unreported.pk), owner),
    }
    answers = {what: run_async(refusal(*args)) for what, args in cases.items()}
    first = answers["a missing session"]
    assert first[0] == 403 and b"yard ssh" in first[1]
    assert {what: answer for what, answer in answers.items() if answer != first} == {}


def test_a_session_that_stops_while_connected_is_cut(proxy, cast, session, echo):
    headers = bearer(cast.ann)

    async def connected_then_cut() -> tuple[int | None, float]:
        async with websockets.connect(ws_url(proxy, session.pk), additional_headers=headers) as ws:
            await ws.send(b"ping")
            assert await asyncio.wait_for(ws.recv(), timeout=10) == b"ping"
            await asyncio.to_thread(Job.objects.filter(pk=session.pk).update, state=JobState.CANCELLED)
            started = asyncio.get_running_loop().time()
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=10)
            return ws.close_code, asyncio.get_running_loop().time() - started

    code, took = run_async(connected_then_cut())
    assert code == 1008 and took < 5
    assert echo[1].wait(5), "the sshd side stayed open after the cut"


def test_a_revoked_token_is_cut_too(proxy, cast, session):
    raw = token_create_personal(user=cast.ann, name="cli", expires_at=None)

    async def cut() -> int | None:
        async with websockets.connect(ws_url(proxy, session.pk), additional_headers={"Authorization": f"Bearer {raw.raw}"}) as ws:
            await ws.send(b"x")
            assert await asyncio.wait_for(ws.recv(), timeout=10) == b"x"
            await asyncio.to_thread(type(raw.token).objects.filter(pk=raw.token.pk).update, revoked_at=timezone.now())
            with pytest.raises(websockets.ConnectionClosed):
                await asyncio.wait_for(ws.recv(), timeout=10)
            return ws.close_code

    assert run_async(cut()) == 1008


def test_another_sites_page_cannot_open_a_tunnel_with_the_session_cookie(proxy, cast, session):
    evil = {**cookie_of(cast.ann), "Origin": "https://evil.example"}
    assert run_async(refusal(ws_url(proxy, session.pk), evil))[0] == 403


def test_an_sshd_that_closes_closes_the_websocket(proxy, cast, settings):
    listener = socket.create_server(("127.0.0.1", 0))

    def banner_then_close() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    threading.Thread(target=banner_then_close, daemon=True).start()
    job = dev_session(team=cast.org.team_a, user=cast.ann, endpoint=f"127.0.0.1:{listener.getsockname()[1]}")
    headers = bearer(cast.ann)

    async def read_all() -> tuple[bytes, int | None]:
        async with websockets.connect(ws_url(proxy, job.pk), additional_headers=headers) as ws:
            got = b""
            with pytest.raises(websockets.ConnectionClosedOK):
                while True:
                    got += await asyncio.wait_for(ws.recv(), timeout=10)  # type: ignore[operator]
            return got, ws.close_code

    try:
        assert run_async(read_all()) == (b"SSH-2.0-OpenSSH_9.2\r\n", 1000)
    finally:
        listener.close()


def test_an_sshd_that_does_not_answer_is_a_502_for_the_owner(proxy, cast):
    job = dev_session(team=cast.org.team_a, user=cast.ann, endpoint=f"127.0.0.1:{free_port()}")
    status, body = run_async(refusal(ws_url(proxy, job.pk), bearer(cast.ann)))
    assert status == 502 and b"does not answer" in body


def test_plain_http_is_told_to_use_yard_ssh(proxy, session):
    answer = httpx.get(f"{proxy}/dev-sessions/{session.pk}/ssh")
    assert answer.status_code == 426 and "yard ssh" in answer.json()["message"]
    assert answer.headers["upgrade"] == "websocket"


def test_endpoints_as_agents_report_them() -> None:
    assert parse_endpoint("127.0.0.1:20001") == Endpoint("127.0.0.1", 20001)
    assert parse_endpoint("[fd00::7]:22") == Endpoint("fd00::7", 22)
    assert parse_endpoint("gpu-node-3:2222") == Endpoint("gpu-node-3", 2222)
    for bad in ("", "127.0.0.1", "fd00::7:22", "host:0", "host:70000", "a b:22"):
        assert parse_endpoint(bad) is None, bad


def test_an_address_that_guessed_tokens_is_refused_even_the_owners(proxy, cast, session, settings):
    settings.YARD = {**settings.YARD, "TOKEN_FAILURE_LIMIT": 2}
    owner = bearer(cast.ann)
    url = ws_url(proxy, session.pk)
    assert run_async(round_trip(url, owner, b"x")) == b"x"
    for guess in ("ym_guess-1", "ym_guess-2"):
        assert run_async(refusal(url, {"Authorization": f"Bearer {guess}"}))[0] == 403
    assert run_async(refusal(url, owner))[0] == 403  # locked out, as the API's tokens are (tenants/lockout.py)
