"""The dev-session tunnel: SSH over a websocket at ``/dev-sessions/<id>/ssh`` on the portal's ASGI server
(docs/dev-sessions.md). ``yard ssh --proxy <id>`` (ssh's ProxyCommand) opens it; this checks the caller,
opens TCP to the session's sshd (``Task.dev_endpoint``, reachable from the portal only) and copies bytes
both ways: each binary frame from the caller is written to the sshd, each read from the sshd is one
binary frame back. The bytes are SSH's own, end-to-end encrypted between the person's ssh and the node's
sshd (whose host key the CLI pins): the portal sees only ciphertext, and never holds an SSH key.

Who: the session's owner only (not the team lead or an admin, who may stop it but must not log in as its
owner), signed in by the portal session cookie or ``Authorization: Bearer <personal API token>`` (a
team's service-account token is refused: a CI robot has no business in a person's shell), while the job
(kind "dev") is RUNNING and its current attempt's rank-0 task runs and has reported its sshd's endpoint.
Everything else — no credentials, a bad token, someone else's session, a stopped or missing one, a
cross-site Origin, a Host the portal does not serve — gets the same refusal in the handshake (HTTP 403,
or close 1008 where the server cannot answer a handshake with a body), so the answer does not reveal
which sessions exist. Bad tokens count towards the address's lockout as the API's do (tenants/lockout.py).

An open tunnel is checked again every RECHECK_S: a session that stops, a token revoked, a session cookie
signed out is cut (close 1008) within that time. Plain HTTP to the path answers 426 with a hint to use
``yard ssh``. Nothing here answers 500: an sshd that does not answer is a 502, a database that cannot be
read a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import DatabaseError, close_old_connections
from django.http import HttpRequest
from django.http.cookie import parse_cookie
from django.http.request import split_domain_port, validate_host

from portal.notebook_proxy import (
    ASGIApp,
    Receive,
    Scope,
    Send,
    _header,
    _origin_of,
    _session_user,
    notebook_public_url,
    portal_url,
)

log = logging.getLogger(__name__)

PATH = re.compile(r"^/dev-sessions/(?P<pk>[0-9]{1,18})/ssh/?$")
RECHECK_S = 5.0  # an open tunnel's authorization is checked again this often: a stopped session is cut within it
CONNECT_TIMEOUT_S = 10.0
READ_CHUNK = 64 * 1024  # one websocket frame at most (well under uvicorn's 16 MiB ws_max_size)
_ENDPOINT = re.compile(r"^(?:\[(?P<v6>[^\[\]/\s]+)\]|(?P<host>[^:\[\]/\s]+)):(?P<port>[0-9]{1,5})$")
REFUSED = "No running dev session of yours has this id (sign in, or send a personal API token: yard ssh does)."
HINT = "This is the SSH tunnel of a dev session: a websocket, not a page. Connect with `yard ssh <id>` (docs/dev-sessions.md)."


class _Unavailable(Exception):
    """The database could not be read: the caller is told to try again (503), never a 500."""


@dataclass(frozen=True)
class Credential:
    session_key: str | None
    token: str | None  # the raw bearer token, when the caller sent one
    ip: str


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


def parse_endpoint(value: str) -> Endpoint | None:
    """``host:port`` or ``[v6]:port`` as the agent reports it; None for anything else."""
    found = _ENDPOINT.match(value.strip())
    if found is None:
        return None
    port = int(found["port"])
    if not 0 < port < 65536:
        return None
    return Endpoint(host=found["v6"] or found["host"], port=port)


def _user_of(credential: Credential, *, again: bool) -> Any:
    """The person the credential signs in, or None. A bad token counts towards the address's lockout, and a
    locked-out address is refused whatever it sends (as the API's token authentication does) — when a tunnel
    opens: an open one (``again``) is not cut because others behind the same address guessed tokens."""
    from tenants.lockout import bad_token_seen, bad_token_wait
    from tenants.models import TokenKind
    from tenants.services import token_authenticate

    if credential.token is not None:
        if not again and bad_token_wait(credential.ip) is not None:
            return None
        token = token_authenticate(raw=credential.token)
        if token is None:
            if not again:
                bad_token_seen(credential.ip)
            return None
        return token.user if token.kind == TokenKind.PERSONAL else None
    user = _session_user(credential.session_key)
    return user if user.is_authenticated else None


def _target_sync(credential: Credential, pk: int, again: bool = False) -> Endpoint | None:
    """Where the tunnel of session ``pk`` goes, if the credential's person owns it and it runs; else None."""
    from scheduling.models import Job, JobKind, Task
    from scheduling.states import JobState, TaskState

    close_old_connections()  # as Django does around each request: this runs outside one
    try:
        user = _user_of(credential, again=again)
        if user is None:
            return None
        job = Job.objects.filter(pk=pk, kind=JobKind.DEV, state=JobState.RUNNING, user=user).only("attempt").first()
        if job is None:
            return None
        endpoint = (
            Task.objects.filter(job=job, attempt=job.attempt, rank=0, state=TaskState.RUNNING)
            .exclude(dev_endpoint="")
            .values_list("dev_endpoint", flat=True)
            .first()
        )
        return parse_endpoint(endpoint) if endpoint else None
    except DatabaseError as exc:  # down, or a connection that broke
        raise _Unavailable(str(exc)) from exc
    finally:
        close_old_connections()


def _client_ip(scope: Scope) -> str:
    from tenants.lockout import client_ip

    request = HttpRequest()
    client = scope.get("client")
    request.META["REMOTE_ADDR"] = str(client[0]) if client else ""
    forwarded = _header(scope, "x-forwarded-for")
    if forwarded is not None:
        request.META["HTTP_X_FORWARDED_FOR"] = forwarded
    return client_ip(request) or "unknown"


def _credential(scope: Scope) -> Credential:
    authorization = _header(scope, "authorization")
    token = None
    if authorization is not None:
        scheme, _, raw = authorization.strip().partition(" ")
        token = raw.strip() if scheme.lower() in ("bearer", "token") else ""  # another scheme: one that fails
    cookies = parse_cookie(_header(scope, "cookie") or "")
    return Credential(session_key=cookies.get(settings.SESSION_COOKIE_NAME), token=token, ip=_client_ip(scope))


def _host_served(scope: Scope) -> bool:
    """The Host is one the portal serves (ALLOWED_HOSTS): no DNS-rebound name reaches a session."""
    domain, _ = split_domain_port(_header(scope, "host") or "")
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # as Django's own Host check in DEBUG
    return bool(domain) and validate_host(domain, allowed)


def _origin_allowed(scope: Scope) -> bool:
    """A page of another site must not open a tunnel with the person's session cookie: a browser's Origin,
    where it sends one, is this server's, the portal's or the notebook proxy's. The CLI sends none."""
    origin = _header(scope, "origin")
    if origin is None:
        return True
    scheme = "https" if scope.get("scheme") in ("https", "wss") or settings.SESSION_COOKIE_SECURE else "http"
    own = f"{scheme}://{_header(scope, 'host') or ''}"
    return origin in {own, _origin_of(portal_url()), _origin_of(notebook_public_url())}


class DevProxy:
    """ASGI: the websocket /dev-sessions/<id>/ssh to the session's sshd; everything else to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = PATH.match(scope.get("path", "")) if scope["type"] in ("http", "websocket") else None
        if found is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "http":
            await _json(send, 426, HINT, upgrade=True)
            return
        try:
            await self._websocket(scope, receive, send, int(found["pk"]))
        except Exception:
            log.exception("dev proxy: %s", scope.get("path"))
            with contextlib.suppress(Exception):  # refused, or cut: never left hanging
                await send({"type": "websocket.close", "code": 1011})

    async def target(self, credential: Credential, pk: int, *, again: bool = False) -> Endpoint | None:
        return await sync_to_async(_target_sync)(credential, pk, again)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send, pk: int) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        credential = _credential(scope)
        try:
            endpoint = await self.target(credential, pk) if _host_served(scope) and _origin_allowed(scope) else None
        except _Unavailable as exc:
            log.warning("dev proxy: session %s: the database cannot be read: %s", pk, exc)
            await _deny(scope, send, 503, "The portal cannot check this session now; try again in a few seconds.")
            return
        if endpoint is None:
            await _deny(scope, send, 403, REFUSED)
            return
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(endpoint.host, endpoint.port), CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            log.warning("dev proxy: session %s: sshd at %s:%s: %s", pk, endpoint.host, endpoint.port, exc)
            await _deny(scope, send, 502, "The session's sshd does not answer: it is starting or stopping; try again.")
            return
        await send({"type": "websocket.accept"})
        try:
            await self._pump(receive, send, reader, writer, credential, pk, endpoint)
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _pump(
        self,
        receive: Receive,
        send: Send,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        credential: Credential,
        pk: int,
        endpoint: Endpoint,
    ) -> None:
        """Bytes both ways until either side ends, or the session may no longer be reached."""
        closing: list[tuple[int, str]] = []  # the close code and reason for the caller, where this side decides

        async def from_caller() -> None:
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message["type"] != "websocket.receive":
                    continue
                data = message.get("bytes")
                if data is None:  # SSH is bytes: a text frame is not a tunnel's
                    closing.append((1003, "binary frames only"))
                    return
                writer.write(data)
                await writer.drain()

        async def from_sshd() -> None:
            while True:
                data = await reader.read(READ_CHUNK)
                if not data:
                    closing.append((1000, "the session's sshd closed the connection"))
                    return
                await send({"type": "websocket.send", "bytes": data})

        async def still_allowed() -> None:
            while True:
                await asyncio.sleep(RECHECK_S)
                try:
                    now = await self.target(credential, pk, again=True)
                except _Unavailable:
                    continue  # the database's trouble: an open tunnel is not cut for it
                if now != endpoint:
                    log.info("dev proxy: session %s: cut (stopped, or no longer the caller's)", pk)
                    closing.append((1008, "the dev session stopped, or is no longer yours to open"))
                    return

        tasks = [asyncio.ensure_future(c) for c in (from_caller(), from_sshd(), still_allowed())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for task in tasks:
                if not task.cancelled() and task.exception() is not None:
                    log.info("dev proxy: session %s: %s", pk, task.exception())
                    closing.append((1011, "the connection to the session's sshd broke off"))
            code, reason = closing[0] if closing else (1000, "")
            with contextlib.suppress(Exception):  # the caller may be gone already
                await send({"type": "websocket.close", "code": code, "reason": reason})


async def _deny(scope: Scope, send: Send, status: int, message: str) -> None:
    """Refuse in the handshake: an HTTP answer with a body where the server can send one (uvicorn can: the
    CLI prints the message), else close 1008 (which the server answers as HTTP 403)."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = json.dumps({"code": _CODES.get(status, "error"), "message": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        if status == 503:
            headers.append((b"retry-after", b"2"))
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008 if status == 403 else 1011})


_CODES = {403: "forbidden", 502: "bad_gateway", 503: "unavailable"}


async def _json(send: Send, status: int, message: str, *, upgrade: bool = False) -> None:
    body = json.dumps({"code": "upgrade_required", "message": message}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if upgrade:
        headers += [(b"upgrade", b"websocket"), (b"connection", b"Upgrade")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
