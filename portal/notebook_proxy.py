"""The notebook proxy: the browser opens a notebook at ``/notebooks/<id>/lab/`` on the portal, and this
forwards HTTP and websockets to the node's Jupyter server, adding the server's token itself.

As JupyterHub's proxy and Open OnDemand's reverse proxy do, so that GPU nodes need not be reachable from
browsers, no token appears in any URL a browser sees (history, proxy logs, Referer), and the portal's
access rules decide who opens a notebook: its owner, its team's lead, an admin above the team
(scheduling.selectors.can_manage_job), while it runs. Every request is checked against the session
(cached for a few seconds: JupyterLab loads a hundred files at once), so a notebook that stops, or a
person who loses the right, is cut off within that time.

It is an ASGI app in front of Django's (portal/asgi.py), served by uvicorn: the web tier's gunicorn
gthread workers (WSGI) cannot hold websockets. `make run` starts it beside gunicorn (portal/devserver.py);
deployments route ``/notebooks/<id>/lab/`` to it in their reverse proxy (README, *Notebooks through the
portal*). HTTP goes through httpx, websockets through the ``websockets`` library: no HTTP parsing here.

What it changes on the way:
* to the node: the portal's own cookies (session, CSRF) are dropped, the browser's Authorization is
  replaced by the server's token, Origin is the node's own (after this proxy has checked the browser's:
  only this origin or the portal's may post or open a websocket, as Jupyter itself would refuse);
* to the browser: hop-by-hop headers are dropped, a Location on the node's address becomes a path, and a
  Set-Cookie for the portal's cookie names is dropped (a notebook must not set the portal's session).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from http import HTTPStatus
from importlib import import_module
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import websockets
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections, connections
from django.http import HttpRequest
from django.http.cookie import parse_cookie
from django.http.request import split_domain_port, validate_host
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Subprotocol

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PATH = re.compile(r"^/notebooks/(?P<pk>[0-9]{1,18})/lab(?P<rest>/.*)?$")
AUTH_CACHE_S = 3.0
# Jupyter answers a kernel's websocket handshake only once the kernel is up and has answered
# kernel_info (it waits up to its kernel_info_timeout, 60 s by default), so the handshake lasts as
# long as the kernel's start: 2-3 s on a 2-core machine at load 29, longer beside a browser. At 10 s
# the proxy could give up before Jupyter did, and the browser saw a websocket error; it waits as long.
WS_OPEN_TIMEOUT_S = 65.0
_AUTH_CACHE_MAX = 10_000
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
        "transfer-encoding", "upgrade", "host", "content-length",
    }
)  # fmt: skip
# What may stand in a path as it is (RFC 3986 pchar, "/" and "%": the browser's own escapes are kept).
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"


@dataclass(frozen=True)
class Target:
    """The Jupyter server of a notebook the person may open, as portal/notebook_access.py found it."""

    base: str  # http://node:port/notebooks/42/lab/
    token: str | None


@dataclass(frozen=True)
class Verdict:
    signed_in: bool
    target: Target | None


def _session_user(session_key: str | None) -> Any:
    from django.contrib.auth import get_user

    request = HttpRequest()
    request.session = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    return get_user(request)  # AnonymousUser for no session, an expired one, or a changed password


def _authorize_sync(session_key: str | None, pk: int) -> Verdict:
    from portal.notebook_access import notebook_target  # models: only once the apps are loaded

    close_old_connections()  # as Django does around each request: this runs outside one
    try:
        user = _session_user(session_key)
        if not user.is_authenticated:
            return Verdict(signed_in=False, target=None)
        found = notebook_target(user=user, pk=pk)
        return Verdict(signed_in=True, target=Target(base=found.base, token=found.token) if found else None)
    finally:
        close_old_connections()


class NotebookProxy:
    """ASGI: /notebooks/<id>/lab/… to the notebook's Jupyter server; everything else to ``app`` (Django)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._auth: dict[tuple[str | None, int], tuple[float, Verdict]] = {}

    # -- plumbing ------------------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        found = PATH.match(scope.get("path", "")) if scope["type"] in ("http", "websocket") else None
        if found is None:
            await self.app(scope, receive, send)
            return
        pk, rest = int(found["pk"]), found["rest"] or ""
        raw = scope.get("raw_path")
        prefix = f"/notebooks/{pk}/lab".encode()
        if isinstance(raw, bytes) and raw.startswith(prefix):
            # As the browser encoded it (a file name with %2F in it stays one segment), never re-quoted.
            rest = raw[len(prefix) :].decode("latin-1")
        if scope["type"] == "http":
            await self._http(scope, receive, send, pk, rest)
        else:
            await self._websocket(scope, receive, send, pk, rest)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._client is not None:
                    await self._client.aclose()
                    self._client = None
                await sync_to_async(connections.close_all)()  # the thread that checked sessions holds one
                await send({"type": "lifespan.shutdown.complete"})
                return

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:  # one per event loop (a restarted server)
            self._client_loop = loop
            # No environment proxies (a node is reached directly); long reads: a download or a slow save.
            timeout = httpx.Timeout(connect=10.0, read=300.0, write=300.0, pool=30.0)
            self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)
        return self._client

    async def authorize(self, scope: Scope, pk: int) -> Verdict:
        cookies = parse_cookie(_header(scope, "cookie") or "")
        key = (cookies.get(settings.SESSION_COOKIE_NAME), pk)
        now = time.monotonic()
        cached = self._auth.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        verdict = await sync_to_async(_authorize_sync)(key[0], pk)
        if len(self._auth) > _AUTH_CACHE_MAX:
            self._auth.clear()
        self._auth[key] = (now + AUTH_CACHE_S, verdict)
        return verdict

    # -- checks shared by HTTP and websockets ---------------------------------------------------------
    def _own_origin(self, scope: Scope) -> str | None:
        """This proxy's origin as the browser addressed it, if the Host is one the portal serves."""
        host = _header(scope, "host") or ""
        domain, _ = split_domain_port(host)
        allowed = list(settings.ALLOWED_HOSTS)
        if settings.DEBUG and not allowed:
            allowed = [".localhost", "127.0.0.1", "[::1]"]  # as Django's own Host check in DEBUG
        if not domain or not validate_host(domain, allowed):
            return None
        scheme = "https" if scope.get("scheme") in ("https", "wss") or settings.SESSION_COOKIE_SECURE else "http"
        return f"{scheme}://{host}"

    def _origin_allowed(self, scope: Scope) -> bool:
        """A request from another site must not act through the person's session (cross-site POST or
        websocket): the browser's Origin, where it sends one, is this proxy's or the portal's."""
        origin = _header(scope, "origin")
        if origin is None:
            return True
        allowed = {self._own_origin(scope), _origin_of(portal_url()), _origin_of(notebook_public_url())}
        return origin in allowed

    # -- HTTP ---------------------------------------------------------------------------------------
    async def _http(self, scope: Scope, receive: Receive, send: Send, pk: int, rest: str) -> None:
        if self._own_origin(scope) is None:
            await _page(send, 400, "Bad request", "This host name is not one the portal serves (ALLOWED_HOSTS).")
            return
        if not rest:  # /notebooks/42/lab -> /notebooks/42/lab/
            await _redirect(send, f"/notebooks/{pk}/lab/")
            return
        if scope["method"] in _UNSAFE_METHODS and not self._origin_allowed(scope):
            await _page(send, 403, "Forbidden", "A request from another site may not act on a notebook.")
            return
        verdict = await self.authorize(scope, pk)
        if not verdict.signed_in:
            if scope["method"] == "GET" and not rest.startswith("/api/"):
                await _redirect(send, f"{portal_url()}/login/?next={quote(f'/notebooks/{pk}/open')}")
            else:
                await _page(send, 401, "Sign in first", "Sign in to the portal, then open the notebook from its page.")
            return
        target = verdict.target
        if target is None or target.token is None:
            await _not_running(send, pk)
            return
        await self._forward_http(scope, receive, send, target, rest)

    async def _forward_http(self, scope: Scope, receive: Receive, send: Send, target: Target, rest: str) -> None:
        upstream = urlsplit(target.base)
        path = upstream.path.rstrip("/") + rest
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"{upstream.scheme}://{upstream.netloc}{quote(path, safe=_PATH_SAFE)}" + (f"?{query}" if query else "")
        headers = _to_upstream(scope, target, upstream.netloc)
        body = _request_body(receive) if scope["method"] not in ("GET", "HEAD", "OPTIONS") else None
        request = self.client().build_request(scope["method"], url, headers=headers, content=body)
        try:
            response = await self.client().send(request, stream=True)
        except httpx.HTTPError as exc:
            log.warning("notebook proxy: %s %s: %s", scope["method"], url, exc)
            await _page(send, 502, "The notebook does not answer", "Its Jupyter server is starting or stopping; try again.")
            return
        try:
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": _to_browser(response, upstream.netloc)}
            )
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (httpx.HTTPError, OSError) as exc:
            log.warning("notebook proxy: %s %s broke off: %s", scope["method"], url, exc)
        finally:
            await response.aclose()

    # -- websockets ---------------------------------------------------------------------------------
    async def _websocket(self, scope: Scope, receive: Receive, send: Send, pk: int, rest: str) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        verdict = await self.authorize(scope, pk) if self._own_origin(scope) and self._origin_allowed(scope) else None
        target = verdict.target if verdict is not None else None
        if target is None or target.token is None or not rest:
            await send({"type": "websocket.close", "code": 1008})  # refused in the handshake: HTTP 403
            return
        upstream = urlsplit(target.base)
        scheme = "wss" if upstream.scheme == "https" else "ws"
        query = scope.get("query_string", b"").decode("latin-1")
        url = f"{scheme}://{upstream.netloc}{quote(upstream.path.rstrip('/') + rest, safe=_PATH_SAFE)}"
        url += f"?{query}" if query else ""
        protocols = list(scope.get("subprotocols") or [])
        try:
            node = await websockets.connect(
                url,
                additional_headers={"Authorization": f"token {target.token}", "Origin": f"{upstream.scheme}://{upstream.netloc}"},
                subprotocols=[Subprotocol(p) for p in protocols] or None,
                max_size=None,
                open_timeout=WS_OPEN_TIMEOUT_S,
                compression=None,
                ping_interval=None,  # the browser's side keeps it alive; Jupyter pings too
            )
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            log.warning("notebook proxy: websocket %s: %s", url, exc)
            code = 1008 if isinstance(exc, InvalidStatus) and exc.response.status_code in (401, 403, 404) else 1011
            await send({"type": "websocket.close", "code": code})
            return
        await send({"type": "websocket.accept", "subprotocol": node.subprotocol})
        await _pump(receive, send, node)


async def _pump(receive: Receive, send: Send, node: ClientConnection) -> None:
    """Frames both ways until either side closes; the other side is then closed with the same code."""

    async def from_browser() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await node.close(code=_closable(message.get("code", 1000)))
                return
            if message["type"] == "websocket.receive":
                text = message.get("text")
                await node.send(text if text is not None else message.get("bytes") or b"")

    async def from_node() -> None:
        try:
            async for data in node:
                if isinstance(data, str):
                    await send({"type": "websocket.send", "text": data})
                else:
                    await send({"type": "websocket.send", "bytes": data})
        except ConnectionClosed:
            pass
        with contextlib.suppress(Exception):  # the browser may be gone already
            await send({"type": "websocket.close", "code": _closable(node.close_code or 1000)})

    tasks = [asyncio.ensure_future(from_browser()), asyncio.ensure_future(from_node())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await node.close()
        await asyncio.gather(*tasks, return_exceptions=True)


def _closable(code: int) -> int:
    # 1005/1006/1015 are reported, never sent.
    return 1000 if code in (1005, 1006, 1015) or not 1000 <= code <= 4999 else code


# --------------------------------------------------------------------------- helpers


def portal_url() -> str:
    return str(settings.YARD_NOTIFY["PUBLIC_URL"]).rstrip("/")


def notebook_public_url() -> str:
    """Where browsers reach this proxy (YARD_NOTEBOOK_URL); "" for the portal's own address."""
    return str(getattr(settings, "YARD_NOTEBOOK_URL", "") or "").rstrip("/")


def _origin_of(url: str) -> str | None:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else None


def _header(scope: Scope, name: str) -> str | None:
    wanted = name.encode()
    for key, value in scope.get("headers", []):
        if key == wanted:
            return bytes(value).decode("latin-1")
    return None


def _to_upstream(scope: Scope, target: Target, netloc: str) -> list[tuple[str, str]]:
    # Content-Length stays: a known-size upload goes to Jupyter as one, not chunked.
    dropped = (HOP_BY_HOP - {"content-length"}) | {"authorization", "cookie", "origin", "referer"}
    portal_cookies = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    headers = [
        (k.decode("latin-1"), v.decode("latin-1")) for k, v in scope.get("headers", []) if k.decode("latin-1") not in dropped
    ]
    kept = [
        f"{name}={value}" for name, value in parse_cookie(_header(scope, "cookie") or "").items() if name not in portal_cookies
    ]
    if kept:
        headers.append(("cookie", "; ".join(kept)))  # Jupyter's own (its _xsrf), never the portal's
    if _header(scope, "origin") is not None:
        headers.append(("origin", f"{urlsplit(target.base).scheme}://{netloc}"))
    headers.append(("authorization", f"token {target.token}"))
    return headers


def _to_browser(response: httpx.Response, netloc: str) -> list[tuple[bytes, bytes]]:
    portal_cookies = {settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME}
    out = []
    for name, value in response.headers.multi_items():
        lower = name.lower()
        if lower in HOP_BY_HOP - {"content-length"}:
            continue
        if lower == "set-cookie" and value.split("=", 1)[0].strip() in portal_cookies:
            continue
        if lower == "location":
            parts = urlsplit(value)
            if parts.netloc == netloc:  # the node's own address: the browser stays on the proxy
                value = parts.path + (f"?{parts.query}" if parts.query else "")
        out.append((lower.encode("latin-1"), value.encode("latin-1")))
    return out


async def _request_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body = message.get("body", b"")
        if body:
            yield body
        if not message.get("more_body", False):
            return


async def _redirect(send: Send, location: str) -> None:
    await send({"type": "http.response.start", "status": 302, "headers": [(b"location", location.encode("latin-1"))]})
    await send({"type": "http.response.body", "body": b""})


async def _page(send: Send, status: int, title: str, text: str, *, link: str | None = None) -> None:
    more = f'<p><a href="{link}">Back to the portal</a></p>' if link else ""
    body = (
        f"<!doctype html><meta charset=utf-8><title>{title} · Yardmaster</title>"
        f"<body style='font:15px/1.45 system-ui,sans-serif;max-width:36rem;margin:3rem auto'>"
        f"<h1>{title}</h1><p>{text}</p>{more}"
    ).encode()
    headers = [
        (b"content-type", b"text/html; charset=utf-8"),
        (b"content-security-policy", _PAGE_CSP.encode()),
        (b"x-content-type-options", b"nosniff"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _not_running(send: Send, pk: int) -> None:
    await _page(
        send,
        HTTPStatus.NOT_FOUND,
        "No such notebook running",
        "This notebook has stopped, has not started yet, or is not one you may open.",
        link=f"{portal_url()}/notebooks/{pk}/",
    )
