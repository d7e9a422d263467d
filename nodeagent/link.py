"""The agent's link to the portal: one call at a time, one shared backoff, and the silence clock.

The silence clock is what agent-side liveness reads (nodeagent/stopping.py): seconds since the portal
last *accepted a heartbeat* (that alone is what the portal's liveness counts), less the time the portal
said it was blind. A portal that answers 503 ``{"code": "unavailable"}`` is alive but cannot see — its
database is down — and it does not count that time against the node either (it records it as a blind
spell), so the clock pauses between two such answers; a timeout or a refused connection proves
nothing, so the clock runs on. Either way the workloads keep running until the clock passes
``stop_after_s`` (docs/agent-api.md, *What the portal counts as silence*).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodeagent.client import Backoff, PortalBlind, PortalClient, PortalError, PortalUnreachable
from nodeagent.config import BACKOFF_INITIAL_S

# Log one line per this many seconds of an outage, not one per call.
_LOG_EVERY_S = 30.0


@dataclass
class CallStats:
    """What the calls of one kind cost and how they ended (for benchmarks: `nodeagent.fleet --stats-file`)."""

    latencies_s: list[float] = field(default_factory=list)
    ok: int = 0
    blind: int = 0
    unreachable: int = 0
    refused: int = 0

    def add(self, seconds: float) -> None:
        if len(self.latencies_s) < 100_000:
            self.latencies_s.append(seconds)


class PortalLink:
    def __init__(self, *, log: logging.LoggerAdapter[logging.Logger], clock: Callable[[], float], max_backoff_s: float) -> None:
        self.log = log
        self.clock = clock
        self.client: PortalClient | None = None
        self.backoff = Backoff(initial_s=BACKOFF_INITIAL_S, max_s=max_backoff_s)
        self.retry_at = 0.0
        self.last_contact = clock()  # the portal last accepted a heartbeat
        self.paused_s = 0.0  # of the time since, how much the portal said it was blind
        self.last_blind_at: float | None = None
        self.lost = False  # agent-side liveness tripped (set by stopping.py)
        self._logged_at = -_LOG_EVERY_S
        self.stats: dict[str, CallStats] = {}

    def ok(self, now: float) -> bool:
        """May a call go out now (not inside a backoff)?"""
        return now >= self.retry_at

    def silence(self) -> float:
        """Seconds of silence as the portal counts it: since the last accepted heartbeat, less blind time."""
        return self.clock() - self.last_contact - self.paused_s

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST, or None when the portal is unreachable or blind (then every call waits for the backoff).

        A 4xx raises PortalError: the portal answered and refused this call."""
        assert self.client is not None
        kind = path.rsplit("/", 1)[-1]  # heartbeat, status, logs, drain
        stats = self.stats.setdefault(kind, CallStats())
        began = time.monotonic()
        try:
            answer = self.client.post(path, body)
        except PortalBlind as exc:
            stats.blind += 1
            now = self.clock()
            if self.last_blind_at is not None:
                self.paused_s += now - self.last_blind_at
            self.last_blind_at = now
            self._wait(f"portal blind on {path} ({exc}); workloads keep running", retry_after=exc.retry_after_s)
            return None
        except PortalUnreachable as exc:
            stats.unreachable += 1
            self.last_blind_at = None  # nothing is known of the time since: it counts
            self._wait(f"portal unreachable on {path} ({exc})")
            return None
        except PortalError:
            stats.refused += 1
            stats.add(time.monotonic() - began)
            raise
        stats.ok += 1
        stats.add(time.monotonic() - began)
        self.backoff.reset()
        self.retry_at = 0.0
        return answer

    def heartbeat_accepted(self) -> None:
        """The portal recorded a heartbeat: the silence clock starts again from zero."""
        self.last_contact = self.clock()
        self.paused_s = 0.0
        self.last_blind_at = None
        if self.lost:
            self.log.info("portal reachable again")
            self.lost = False

    def refused(self) -> None:
        """A 4xx for a heartbeat: back off like a failure (the silence clock runs on)."""
        self.retry_at = self.clock() + self.backoff.next_delay()

    def _wait(self, message: str, *, retry_after: float | None = None) -> None:
        now = self.clock()
        delay = self.backoff.next_delay()
        if retry_after is not None:
            delay = max(delay, min(retry_after, self.backoff.max_s))
        self.retry_at = now + delay
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            self.log.warning("%s; retrying in %.1f s; silent for %.0f s as the portal counts it", message, delay, self.silence())
