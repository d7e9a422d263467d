"""The portal's agent API over HTTP (docs/agent-api.md), with the standard library's urllib.

One call is one attempt with a timeout; retrying is the caller's business (the agent's loop must not
block for minutes inside a retry), helped by Backoff.

The timeout bounds the whole call, not each step of it. urllib's own applies to every socket operation
apart: a connect that waits on a full listen queue (SYN retransmits), then the wait for the answer,
each got the whole timeout, and a loaded 4,000-job fill saw single heartbeats take 65 s at a 20 s
timeout; the agent's silence and the watchdog's lease (T + I < F, docs/scale.md) rest on one call
lasting at most T. So each step gets what is left of T, and a call past it fails as a timeout.
"""

from __future__ import annotations

import functools
import http.client
import json
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodeagent import __version__

API_PREFIX = "/api/agent/v1/"


class PortalUnreachable(Exception):
    """No usable answer: connection refused, timeout, or a 5xx. Retry later."""


# The answers by which the portal says it is alive but did not take the call, and has recorded so: 503
# "unavailable" (its database is down) and 503/429 "overloaded" (it shed the call). It counts the time
# of either as blind, not as the node's silence (portal/middleware.py), so the agent may too.
BLIND_CODES = frozenset({"unavailable", "overloaded"})
BLIND_STATUSES = frozenset({429, 503})


class PortalBlind(PortalUnreachable):
    """The portal answered 503 {"code": "unavailable"} (its database is down) or 503/429
    {"code": "overloaded"} (it shed the call): it is alive, did not take the call, and does not count
    this time as the node's silence, so neither does the agent (docs/agent-api.md, *What the portal
    counts as silence*). A 503 or 429 without such a code (a load balancer's page) promises nothing."""

    def __init__(self, message: str, retry_after_s: float | None, blind_since: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        # When the portal's blind streak began (its clock); two answers of one streak mean it counts all
        # the time between them as blind (nodeagent/link.py).
        self.blind_since = blind_since


class PortalError(Exception):
    """The portal answered with a 4xx: the request itself is wrong or refused."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body

    @property
    def code(self) -> str | None:
        value = self.body.get("code")
        return value if isinstance(value, str) else None


# The answer must leave the portal this long before the agent's timeout to reach it in time.
DEADLINE_MARGIN_S = 1.0


class _Deadline:
    """One deadline for a whole call, on a clock (time.monotonic)."""

    def __init__(self, timeout_s: float, clock: Callable[[], float]) -> None:
        self.clock, self.at = clock, clock() + timeout_s

    def left(self) -> float:
        """Seconds left, or a timeout now if none are."""
        left = self.at - self.clock()
        if left <= 0:
            raise TimeoutError("timed out (the call's whole timeout ran out)")
        return left


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    """Connects, and waits for the answer, within what is left of one deadline for the whole call."""

    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline

    def connect(self) -> None:
        self.timeout = self.deadline.left()
        super().connect()  # TCP (and for HTTPS the TLS handshake) under what is left

    def getresponse(self) -> http.client.HTTPResponse:
        if self.sock is not None:
            # The answer's status line, headers and small body, each read within what is left.
            self.sock.settimeout(self.deadline.left())
        return super().getresponse()


class _DeadlineHTTPSConnection(_DeadlineHTTPConnection, http.client.HTTPSConnection):
    pass


class _DeadlineHandler(urllib.request.HTTPHandler, urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        urllib.request.HTTPHandler.__init__(self)
        urllib.request.HTTPSHandler.__init__(self)  # TLS as urlopen's: the system's trust store, names checked
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_DeadlineHTTPConnection, deadline=self.deadline), req)

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(functools.partial(_DeadlineHTTPSConnection, deadline=self.deadline), req)


def open_within(
    request: urllib.request.Request, timeout_s: float, *, clock: Callable[[], float] = time.monotonic
) -> http.client.HTTPResponse:
    """urlopen whose ``timeout_s`` bounds the call's steps together: the connect, and the wait for the
    answer after it, share one deadline. Proxies from the environment are honoured as urlopen does."""
    opener = urllib.request.build_opener(_DeadlineHandler(_Deadline(timeout_s, clock)))
    return opener.open(request, timeout=timeout_s)  # type: ignore[no-any-return]


class PortalClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s
        # The portal's clock minus this node's (nodeagent/health.py), once measured: each call then
        # names, in the portal's clock, the moment past which its answer no longer reaches this agent
        # (X-Yard-Deadline), and a portal that only gets to it later sheds it unread, as "overloaded".
        self.offset_s: float | None = None

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST JSON to `API_PREFIX + path`; return the decoded JSON object of a 2xx answer."""
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
            "User-Agent": f"yard-nodeagent/{__version__}",
        }
        if self.offset_s is not None:
            margin = min(DEADLINE_MARGIN_S, 0.25 * self.timeout_s)  # short test timings: a quarter of it
            headers["X-Yard-Deadline"] = f"{time.time() + self.offset_s + self.timeout_s - margin:.3f}"
        request = urllib.request.Request(
            self.base_url + API_PREFIX + path, data=json.dumps(body).encode(), method="POST", headers=headers
        )
        try:
            with open_within(request, self.timeout_s) as response:
                return _decode(response.read())
        except urllib.error.HTTPError as exc:
            payload = _decode(exc.read())
            if exc.code in BLIND_STATUSES and payload.get("code") in BLIND_CODES:
                what = f"portal {payload['code']} (HTTP {exc.code}): {payload.get('message', '')}".rstrip(": ")
                since = payload.get("blind_since")
                blind_since = float(since) if isinstance(since, int | float) and not isinstance(since, bool) else None
                raise PortalBlind(what, _retry_after(exc), blind_since) from exc
            if exc.code >= 500:
                raise PortalUnreachable(f"portal answered HTTP {exc.code}") from exc
            raise PortalError(exc.code, payload) from exc
        except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
            raise PortalUnreachable(f"{type(exc).__name__}: {exc}") from exc


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    try:
        value = float(exc.headers.get("Retry-After", ""))
    except (TypeError, ValueError):
        return None
    return value if 0 < value <= 3600 else None


def _decode(raw: bytes) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {"detail": raw[:200].decode(errors="replace")}
    return value if isinstance(value, dict) else {"value": value}


@dataclass
class Backoff:
    """Exponential backoff with full jitter (AWS style), so 40 agents do not retry in step."""

    initial_s: float
    max_s: float
    failures: int = 0
    rng: random.Random = field(default_factory=random.Random)

    def next_delay(self) -> float:
        self.failures += 1
        ceiling = min(self.max_s, self.initial_s * (2 ** (self.failures - 1)))
        return self.rng.uniform(self.initial_s / 2, max(ceiling, self.initial_s / 2))

    def reset(self) -> None:
        self.failures = 0
