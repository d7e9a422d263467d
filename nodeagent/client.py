"""The portal's agent API over HTTP (docs/agent-api.md), with the standard library's urllib.

One call is one attempt with a timeout; retrying is the caller's business (the agent's loop must not
block for minutes inside a retry), helped by Backoff.
"""

from __future__ import annotations

import http.client
import json
import random
import time
import urllib.error
import urllib.request
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
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
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
