"""The service proxy: ``/services/<team>/<name>/<path>`` on the portal's ASGI server goes to
``<replica url>/<path>`` of one of the service's ready replicas (docs/services.md, "Through the portal").

An ASGI app in front of the notebook proxy (portal/asgi.py), served by the same uvicorn. Per request:

* **who**: ``Authorization: Bearer <token>`` whose SHA-256 is one of the service's live token hashes, or
  the portal session of someone who may call it (scheduling.serving.selectors.can_call_service). No
  credentials: 401. A bad or revoked token: 401, whether the service exists or not; a signed-in person
  who may not call it, or a service that does not exist: the same 404, so neither reveals what exists.
* **where**: the ready replicas as ``service_routes`` reads them, cached ROUTES_TTL_S per service (a
  replica being drained leaves the rotation within about that); among them the one with the fewest
  requests in flight *in this process*, round-robin among ties. A replica that refuses the connection
  (or does not accept it within CONNECT_TIMEOUT_S) was never sent the request, so it is taken out of
  this process's rotation for DOWN_FOR_S and the request goes to another, at most once per replica; a
  request that broke off after it was sent is never resent (it may not be idempotent).
* **how**: the request body streams up and the response streams down chunk by chunk (server-sent
  events, chunked token streams), hop-by-hop headers dropped both ways; the caller's Authorization and
  the portal's cookies never reach the replica; X-Forwarded-For/-Proto/-Host/-Prefix tell it where it
  was called from.
* **what it measured**: per service and window (YARD_SERVICE_WINDOW_S, aligned to multiples of it since
  the epoch) requests, errors (a replica's 5xx, or the proxy's own 502/503/504), time spent in requests
  (start to the last body byte), a latency histogram over SERVICE_LATENCY_EDGES_MS, and the same per
  replica; a request counts in the window it ends in. A background task writes each window to
  ServiceWindow once it is over (never on a request's path) and the open ones at shutdown.

Nothing here answers 500: a replica's failure is a 502 (504 for a timeout), a database that cannot be
read is a 503 with Retry-After, like the API's.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import hmac
import json
import logging
import math
import os
import re
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.http.cookie import parse_cookie

from portal.notebook_proxy import (
    _PATH_SAFE,
    HOP_BY_HOP,
    ASGIApp,
    Message,
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

# Team slugs and service names are slugs (Service.name is a SlugField of at most 63).
PATH = re.compile(r"^/services/(?P<team>[-a-zA-Z0-9_]{1,100})/(?P<name>[-a-zA-Z0-9_]{1,63})(?P<rest>/.*)?$")
ROUTES_TTL_S = 1.0  # a drained replica leaves the rotation within about this
# While the database cannot be read, routes read this recently still serve: a database outage is the
# portal's trouble and must not take every service down with it (DESIGN.md: slower, never killing).
ROUTES_STALE_MAX_S = 30.0
AUTH_CACHE_S = 3.0
_RESENDABLE = frozenset({"GET", "HEAD", "OPTIONS"})  # idempotent and bodiless: safe to send to another replica
DOWN_FOR_S = 3.0  # a replica that refused a connection is left out of this process's rotation this long
CONNECT_TIMEOUT_S = 3.0
READ_TIMEOUT_S = 300.0  # a long completion may take minutes before its first byte
RETRY_AFTER_S = 1
_CACHE_MAX = 10_000
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_FORWARDED = frozenset({"x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-prefix"})
# Not passed on: the caller's credential, and an Expect: 100-continue uvicorn has answered already.
_NOT_FORWARDED = frozenset({"authorization", "expect"})


@dataclass(frozen=True)
class _Routes:
    """What ``service_routes`` said (None: no such service), and until when it is believed."""

    found: Any  # scheduling.serving.selectors.ServiceRoutes | None
    fresh_until: float
    read_at: float


@dataclass
class _Window:
    requests: int = 0
    errors: int = 0
    busy_s: float = 0.0
    counts: list[int] = field(default_factory=list)
    per_replica: dict[str, list[float]] = field(default_factory=dict)


class _DatabaseDown(Exception):
    pass


def _routes_sync(team: str, name: str) -> Any:
    from scheduling.serving.selectors import service_routes  # models: only once the apps are loaded

    close_old_connections()  # as Django does around each request: this runs outside one
    try:
        return service_routes(team=team, name=name)
    finally:
        close_old_connections()


def _may_call_sync(session_key: str | None, service_id: int | None) -> tuple[bool, bool]:
    """(signed in, may call the service) for the person of this session."""
    from scheduling.models import Service
    from scheduling.serving.selectors import can_call_service

    close_old_connections()
    try:
        user = _session_user(session_key)
        if not user.is_authenticated:
            return False, False
        if service_id is None:
            return True, False
        service = Service.objects.filter(pk=service_id).first()
        return True, service is not None and can_call_service(user=user, service=service)
    finally:
        close_old_connections()


def _write_windows_sync(rows: list[dict[str, Any]], tokens_used: set[str]) -> None:
    from django.utils import timezone

    from scheduling.models import Service, ServiceToken, ServiceWindow

    close_old_connections()
    try:
        if tokens_used:  # to the window: what the tokens page shows people
            ServiceToken.objects.filter(token_hash__in=tokens_used).update(last_used_at=timezone.now())
        live = set(Service.objects.filter(pk__in={r["service_id"] for r in rows}).values_list("pk", flat=True))
        objects = [ServiceWindow(**r) for r in rows if r["service_id"] in live]  # a deleted service's are dropped
        ServiceWindow.objects.bulk_create(
            objects,
            update_conflicts=True,
            unique_fields=["service", "start", "source"],
            update_fields=["requests", "errors", "busy_s", "latency_counts", "per_replica"],
        )
    finally:
        close_old_connections()


class ServiceProxy:
    """ASGI: /services/<team>/<name>/… to a ready replica of that service; everything else to ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.source = f"{socket.gethostname()}:{os.getpid()}"[:64]
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._routes: dict[tuple[str, str], _Routes] = {}
        self._reading: dict[tuple[str, str], asyncio.Future[_Routes]] = {}
        self._auth: dict[tuple[str | None, int | None], tuple[float, tuple[bool, bool]]] = {}
        self._inflight: dict[int, int] = {}  # replica job id -> requests in flight through this process
        self._turn: dict[int, int] = {}  # service id -> round-robin counter among ties
        self._down: dict[str, float] = {}  # replica url -> monotonic time it may be tried again
        self._windows: dict[tuple[int, float], _Window] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._tokens_used: set[str] = set()  # token hashes used since the last write (for last_used_at)

    # -- plumbing ------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
            return
        found = PATH.match(scope.get("path", "")) if scope["type"] in ("http", "websocket") else None
        if found is None:
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # not proxied (yet): refused in the handshake, not left to Django
            if (await receive())["type"] == "websocket.connect":
                await send({"type": "websocket.close", "code": 1008})
            return
        team, name, rest = found["team"], found["name"], found["rest"] or "/"
        raw = scope.get("raw_path")
        prefix = f"/services/{team}/{name}".encode()
        if isinstance(raw, bytes) and raw.startswith(prefix):
            rest = raw[len(prefix) :].decode("latin-1") or "/"  # as the caller encoded it, never re-quoted
        sent = _Tracked(send)
        try:
            await self._http(scope, receive, sent, team, name, rest)
        except Exception:
            log.exception("service proxy: %s %s", scope.get("method"), scope.get("path"))
            if not sent.started:
                await _json(sent, 502, "The proxy could not forward this request.")

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The inner app's lifespan (the notebook proxy's), with this one's start and end around it."""

        async def inner_receive() -> Message:
            message = await receive()
            if message["type"] == "lifespan.shutdown":
                await self.shutdown()
            return message

        async def inner_send(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self._ensure_flusher()
            await send(message)

        await self.app(scope, inner_receive, inner_send)

    async def shutdown(self) -> None:
        """Stop the flusher and write every window, the open ones too."""
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._flusher
            self._flusher = None
        await self.flush(everything=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # one per event loop (a restarted server)
            self._client_loop = loop
            timeout = httpx.Timeout(connect=CONNECT_TIMEOUT_S, read=READ_TIMEOUT_S, write=READ_TIMEOUT_S, pool=10.0)
            limits = httpx.Limits(max_connections=1000, max_keepalive_connections=200, keepalive_expiry=30.0)
            # No environment proxies (a replica is reached directly), no redirects followed (the caller's).
            self._client = httpx.AsyncClient(timeout=timeout, limits=limits, follow_redirects=False, trust_env=False)
        return self._client

    # -- reads (cached) -------------------------------------------------------------------------------
    async def routes(self, team: str, name: str) -> Any:
        """The service's ServiceRoutes (None: no such service), at most ROUTES_TTL_S old; one read at a
        time per service however many requests wait for it. _DatabaseDown when it cannot be read."""
        key = (team, name)
        now = time.monotonic()
        cached = self._routes.get(key)
        if cached is not None and cached.fresh_until > now:
            return cached.found
        reading = self._reading.get(key)
        if reading is None:
            reading = asyncio.ensure_future(self._read_routes(key))
            self._reading[key] = reading
            reading.add_done_callback(lambda _: self._reading.pop(key, None))
        try:
            return (await asyncio.shield(reading)).found
        except Exception as exc:
            if cached is not None and now - cached.read_at < ROUTES_STALE_MAX_S:
                log.warning(
                    "service proxy: cannot read routes of %s/%s (%s); using ones %.0f s old",
                    team,
                    name,
                    exc,
                    now - cached.read_at,
                )
                return cached.found
            raise _DatabaseDown(str(exc)) from exc

    async def _read_routes(self, key: tuple[str, str]) -> _Routes:
        found = await sync_to_async(_routes_sync)(*key)
        now = time.monotonic()
        if len(self._routes) > _CACHE_MAX:
            self._routes.clear()
        entry = _Routes(found=found, fresh_until=now + ROUTES_TTL_S, read_at=now)
        self._routes[key] = entry
        return entry

    async def may_call(self, session_key: str | None, service_id: int | None) -> tuple[bool, bool]:
        key = (session_key, service_id)
        now = time.monotonic()
        cached = self._auth.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        verdict = await sync_to_async(_may_call_sync)(session_key, service_id)
        if len(self._auth) > _CACHE_MAX:
            self._auth.clear()
        self._auth[key] = (now + AUTH_CACHE_S, verdict)
        return verdict

    # -- one request ------------------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: _Tracked, team: str, name: str, rest: str) -> None:
        started = time.monotonic()
        bearer = _bearer(scope)
        signed_in = allowed = False
        session_key = parse_cookie(_header(scope, "cookie") or "").get(settings.SESSION_COOKIE_NAME)
        if bearer is None and not session_key:
            await _json(send, 401, "Authentication required: Authorization: Bearer <service token>, or a portal session.")
            return
        try:
            found = await self.routes(team, name)
            if bearer is None:
                signed_in, allowed = await self.may_call(session_key, found.service_id if found is not None else None)
        except Exception as exc:  # the database: _DatabaseDown, or the session store's own
            log.warning("service proxy: %s/%s: cannot check the request: %s", team, name, exc)
            await _json(send, 503, "The portal cannot read its database; try again shortly.", retry_after=True)
            return
        if bearer is not None:
            matched = _token_matches(bearer, found.token_hashes) if found is not None else None
            if matched is None:
                await _json(send, 401, "This token is not valid for this service (unknown, revoked, or another's).")
                return
            self._tokens_used.add(matched)
        elif not signed_in:
            await _json(send, 401, "Your portal session has ended; sign in again.")
            return
        elif found is None or not allowed:
            await _json(send, 404, "No such service.")
            return
        elif scope["method"] in _UNSAFE_METHODS and not _origin_allowed(scope):
            # The session is a cookie a browser sends by itself: another site must not act through it.
            await _json(send, 403, "A request from another site may not call a service with your portal session.")
            return
        status, job_id = await self._forward(scope, receive, send, found, rest)
        self._record(found.service_id, job_id, status, time.monotonic() - started)

    async def _forward(self, scope: Scope, receive: Receive, send: _Tracked, found: Any, rest: str) -> tuple[int, int | None]:
        """Send the request to a replica and stream its answer back; (the status answered, the replica)."""
        routes = found.routes
        if not routes:
            await _json(send, 503, _none_ready(found.replicas), retry_after=True)
            return 503, None
        caller = _Caller(receive, with_body=_has_body(scope))
        query = scope.get("query_string", b"").decode("latin-1")
        tried: set[int] = set()
        while True:
            route = self._choose(found.service_id, routes, tried)
            if route is None:  # every ready replica refused the connection: nothing was sent
                await _json(
                    send, 503, f"No replica of this service accepted the connection ({len(routes)} ready).", retry_after=True
                )
                return 503, None
            tried.add(route.job_id)
            upstream = urlsplit(route.url)
            path = upstream.path.rstrip("/") + rest
            url = f"{upstream.scheme}://{upstream.netloc}{quote(path, safe=_PATH_SAFE)}" + (f"?{query}" if query else "")
            headers = _to_replica(scope, found.team, found.name)
            request = self.client().build_request(scope["method"], url, headers=headers, content=caller.body())
            self._inflight[route.job_id] = self._inflight.get(route.job_id, 0) + 1
            try:
                try:
                    response = await self.client().send(request, stream=True)
                except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                    if caller.body_started:  # cannot happen before a connection; never resend what was sent
                        raise
                    log.warning("service proxy: replica %s (job %s) refused: %s; trying another", route.url, route.job_id, exc)
                    if len(self._down) > _CACHE_MAX:  # replicas long gone: start over
                        self._down.clear()
                    self._down[route.url] = time.monotonic() + DOWN_FOR_S
                    continue
                except httpx.TimeoutException as exc:
                    log.warning("service proxy: %s %s: %s", scope["method"], url, exc)
                    await _json(send, 504, "The replica did not answer in time.")
                    return 504, route.job_id
                except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                    # The connection broke before any answer: typically a kept-alive connection to a replica
                    # that was killed since. A request that may be sent twice (GET, HEAD, OPTIONS, with no
                    # body sent) goes to another replica, as nginx's proxy_next_upstream does; others get a 502.
                    if scope["method"] not in _RESENDABLE or caller.body_started:
                        log.warning("service proxy: %s %s: %s", scope["method"], url, exc)
                        await _json(send, 502, "The replica broke off the request.")
                        return 502, route.job_id
                    log.warning("service proxy: replica %s (job %s) broke off: %s; trying another", route.url, route.job_id, exc)
                    if len(self._down) > _CACHE_MAX:
                        self._down.clear()
                    self._down[route.url] = time.monotonic() + DOWN_FOR_S
                    continue
                except httpx.HTTPError as exc:
                    log.warning("service proxy: %s %s: %s", scope["method"], url, exc)
                    await _json(send, 502, "The replica broke off the request.")
                    return 502, route.job_id
                self._down.pop(route.url, None)
                status = await self._stream_down(scope, send, caller, response, url, found)
                return status, route.job_id
            finally:
                self._inflight[route.job_id] -= 1
                if not self._inflight[route.job_id]:
                    del self._inflight[route.job_id]

    async def _stream_down(
        self, scope: Scope, send: _Tracked, caller: _Caller, response: httpx.Response, url: str, found: Any
    ) -> int:
        """The replica's answer to the caller as it comes; the status to count (502 if it broke off)."""
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": response.status_code,
                    "headers": _to_caller(response, found.team, found.name),
                }
            )
            pump = asyncio.ensure_future(_pump(send, response))
            gone = asyncio.ensure_future(caller.disconnected())
            try:
                await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not pump.done():  # the caller left: stop reading the replica
                    pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
            if pump.cancelled():
                return response.status_code
            exc = pump.exception()
            if exc is not None:
                log.warning("service proxy: %s %s broke off: %s", scope["method"], url, exc)
                return 502  # the caller sees a cut response (no final chunk), not a complete one
            return response.status_code
        finally:
            await response.aclose()

    def _choose(self, service_id: int, routes: Any, tried: set[int]) -> Any:
        """The ready replica with the fewest requests in flight here, round-robin among ties; one that
        refused a connection lately only when no other is left."""
        now = time.monotonic()
        left = [r for r in routes if r.job_id not in tried]
        if not left:
            return None
        up = [r for r in left if self._down.get(r.url, 0.0) <= now]
        pool = up or left
        least = min(self._inflight.get(r.job_id, 0) for r in pool)
        ties = [r for r in pool if self._inflight.get(r.job_id, 0) == least]
        turn = self._turn.get(service_id, 0)
        self._turn[service_id] = turn + 1
        return ties[turn % len(ties)]

    # -- measurements ---------------------------------------------------------------------------------
    def _record(self, service_id: int, job_id: int | None, status: int, seconds: float) -> None:
        from scheduling.serving.selectors import SERVICE_LATENCY_EDGES_MS, window_s

        size = window_s()
        start = math.floor(time.time() / size) * size  # the window the request ends in
        window = self._windows.get((service_id, start))
        if window is None:
            window = self._windows[(service_id, start)] = _Window(counts=[0] * (len(SERVICE_LATENCY_EDGES_MS) + 1))
        window.requests += 1
        window.errors += status >= 500
        window.busy_s += seconds
        window.counts[bisect.bisect_left(SERVICE_LATENCY_EDGES_MS, seconds * 1000.0)] += 1
        if job_id is not None:
            per = window.per_replica.setdefault(str(job_id), [0, 0.0])
            per[0] += 1
            per[1] += seconds
        self._ensure_flusher()

    def _ensure_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush_forever())

    async def _flush_forever(self) -> None:
        from scheduling.serving.selectors import window_s

        while True:
            size = window_s()
            # Just after the next window boundary: every request that ended in the window before has counted.
            await asyncio.sleep(size - time.time() % size + 0.05)
            try:
                await self.flush()
            except Exception:
                log.exception("service proxy: writing its windows failed; retrying at the next window")

    async def flush(self, *, everything: bool = False) -> None:
        """Write the windows that are over (``everything``: the open ones too) to ServiceWindow. What could
        not be written is kept for the next try, at most ten minutes of it."""
        from scheduling.serving.selectors import window_s

        now = time.time()
        size = window_s()
        done = sorted(k for k in self._windows if everything or k[1] + size <= now)
        if not done:
            return
        rows = [
            {
                "service_id": service_id,
                "start": datetime.fromtimestamp(start, tz=UTC),
                "source": self.source,
                "requests": w.requests,
                "errors": w.errors,
                "busy_s": round(w.busy_s, 6),
                "latency_counts": w.counts,
                "per_replica": {k: [int(v[0]), round(v[1], 6)] for k, v in w.per_replica.items()},
            }
            for service_id, start in done
            for w in [self._windows[(service_id, start)]]
        ]
        tokens, self._tokens_used = self._tokens_used, set()
        try:
            await sync_to_async(_write_windows_sync)(rows, tokens)
        except Exception as exc:
            self._tokens_used |= tokens
            log.warning("service proxy: cannot write %d windows yet: %s", len(rows), exc)
            for key in [k for k in self._windows if k[1] < now - 600]:
                del self._windows[key]
            return
        for key in done:
            self._windows.pop(key, None)


# --------------------------------------------------------------------------- helpers


class _Tracked:
    """``send``, remembering whether the response has started (a failure after that cannot be a 502)."""

    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
        await self.send(message)


class _Caller:
    """The caller's side of ``receive``: its body, streamed once, then whether it has gone away."""

    def __init__(self, receive: Receive, *, with_body: bool) -> None:
        self.receive = receive
        self.with_body = with_body
        self.body_started = False
        self.body_done = not with_body
        self.gone = False

    def body(self) -> AsyncIterator[bytes] | None:
        return self._body() if self.with_body and not self.body_started else None

    async def _body(self) -> AsyncIterator[bytes]:
        self.body_started = True
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                self.body_done = True
                return
            body = message.get("body", b"")
            if body:
                yield body
            if not message.get("more_body", False):
                self.body_done = True
                return

    async def disconnected(self) -> None:
        """Returns when the caller has gone (a stream to nobody must stop); never while its body is unread."""
        if self.gone:
            return
        if not self.body_done:  # the replica answered before reading it all: the body is httpx's to read
            await asyncio.Event().wait()
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.gone = True
                return


async def _pump(send: Send, response: httpx.Response) -> None:
    async for chunk in response.aiter_raw():
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, "authorization")
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""  # another scheme: a credential that fails


def _token_matches(token: str, hashes: frozenset[str]) -> str | None:
    """The hash of ``token`` if it is one of ``hashes``; None if not."""
    digest = hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()
    matched = False
    for known in hashes:  # all of them, each in constant time: no early exit that times a prefix
        matched |= hmac.compare_digest(digest, known)
    return digest if matched and token else None


def _origin_allowed(scope: Scope) -> bool:
    origin = _header(scope, "origin")
    if origin is None:
        return True
    scheme = "https" if scope.get("scheme") == "https" else "http"
    own = f"{scheme}://{_header(scope, 'host') or ''}"
    return origin in {own, _origin_of(portal_url()), _origin_of(notebook_public_url())}


def _has_body(scope: Scope) -> bool:
    if _header(scope, "transfer-encoding") is not None:
        return True
    length = _header(scope, "content-length")
    return length is not None and length.strip() not in ("", "0")


def _connection_tokens(value: str | None) -> set[str]:
    return {t.strip().lower() for t in (value or "").split(",") if t.strip()}


def _to_replica(scope: Scope, team: str, name: str) -> list[tuple[str, str]]:
    # Content-Length stays: a known-size body goes up as one, not chunked.
    dropped = (HOP_BY_HOP - {"content-length"}) | _FORWARDED | _NOT_FORWARDED | _connection_tokens(_header(scope, "connection"))
    portal_cookies = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    headers = []
    forwarded_for = None
    for k, v in scope.get("headers", []):
        key = k.decode("latin-1").lower()
        if key == "x-forwarded-for":
            forwarded_for = v.decode("latin-1")
        if key in dropped or key == "cookie":
            continue
        headers.append((key, v.decode("latin-1")))
    kept = [f"{n}={v}" for n, v in parse_cookie(_header(scope, "cookie") or "").items() if n not in portal_cookies]
    if kept:
        headers.append(("cookie", "; ".join(kept)))
    client = scope.get("client")
    if client:
        headers.append(("x-forwarded-for", f"{forwarded_for}, {client[0]}" if forwarded_for else str(client[0])))
    headers.append(("x-forwarded-proto", "https" if scope.get("scheme") == "https" else "http"))
    host = _header(scope, "host")
    if host:
        headers.append(("x-forwarded-host", host))
    headers.append(("x-forwarded-prefix", f"/services/{team}/{name}"))
    return headers


def _to_caller(response: httpx.Response, team: str, name: str) -> list[tuple[bytes, bytes]]:
    portal_cookies = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    dropped = (HOP_BY_HOP - {"content-length"}) | _connection_tokens(response.headers.get("connection"))
    netloc = response.request.url.netloc.decode("ascii")
    out = []
    for key, value in response.headers.multi_items():
        lower = key.lower()
        if lower in dropped:
            continue
        if lower == "set-cookie" and value.split("=", 1)[0].strip() in portal_cookies:
            continue  # a replica must not set the portal's session
        if lower == "location":
            parts = urlsplit(value)
            if parts.netloc == netloc:  # the replica's own address: the caller stays on the proxy
                value = f"/services/{team}/{name}{parts.path}" + (f"?{parts.query}" if parts.query else "")
        out.append((lower.encode("latin-1"), value.encode("latin-1")))
    return out


def _none_ready(replicas: int) -> str:
    if replicas == 0:
        return "This service has no replicas (0 running or starting); try again once one is ready."
    noun = "replica" if replicas == 1 else "replicas"
    return f"None of this service's {replicas} {noun} is ready yet; try again shortly."


async def _json(send: Send, status: int, detail: str, *, retry_after: bool = False) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="yardmaster services"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
