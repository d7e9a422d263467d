"""The agent's link to the portal: one call at a time, one shared backoff, and the silence clock.

The silence clock is what agent-side liveness reads (nodeagent/stopping.py): seconds since the portal
last *accepted a heartbeat* (that alone is what the portal's liveness counts), less the time the portal
said it was blind. A portal that answers 503 ``{"code": "unavailable"}`` is alive but cannot see — its
database is down — and one that answers 503/429 ``{"code": "overloaded"}`` is alive and shedding; it
does not count that time against the node either (it records it as a blind spell), so such an answer
is as good as an accepted heartbeat for this clock: it pauses between two of them. A timeout or a
refused connection proves nothing, so the clock runs on. Either way the workloads keep running until
the clock passes ``stop_after_s`` (docs/agent-api.md, *What the portal counts as silence*).

The portal counts one blind streak, [its first blind answer, its latest + one heartbeat interval], as
blind (scheduling/agent/liveness.py), and names the streak's start in each answer (``blind_since``).
Between two answers of one streak the clock pauses for all the time between them, however slow the
calls were; otherwise (a new streak, or a portal that names none) each pause is at most ``cover_s``
(the heartbeat interval) from the *sending* of the previous blind answer's request, so the agent
never pauses for time the portal counts. A Retry-After
is honoured with jitter, and capped at that same interval, so a shedding spell stays one spell.
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
    def __init__(
        self,
        *,
        log: logging.LoggerAdapter[logging.Logger],
        clock: Callable[[], float],
        max_backoff_s: float,
        before_call: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self.clock = clock
        # Renews the watchdog's lease before each call, so that however many calls a turn of the loop
        # makes, the lease waits at most one HTTP timeout (config.check_timeouts).
        self.before_call = before_call
        self.client: PortalClient | None = None
        self.backoff = Backoff(initial_s=BACKOFF_INITIAL_S, max_s=max_backoff_s)
        self.retry_at = 0.0
        self.last_contact = clock()  # the portal last accepted a heartbeat
        self.paused_s = 0.0  # of the time since, how much the portal said it was blind
        self.last_blind_at: float | None = None  # when the latest blind answer came
        self.blind_sent_at: float | None = None  # when its request went out
        self.blind_streak: float | None = None  # the portal's blind_since in that answer
        self.lost = False  # agent-side liveness tripped (set by stopping.py)
        # The longest silence (as above) and the longest wall-clock gap between two accepted heartbeats so
        # far: what a bench reads to say how close the agents came to stop_after_s.
        self.longest_silence_s = 0.0
        self.longest_gap_s = 0.0
        self._logged_at = -_LOG_EVERY_S
        self.stats: dict[str, CallStats] = {}

    def ok(self, now: float) -> bool:
        """May a call go out now (not inside a backoff)?"""
        return now >= self.retry_at

    @property
    def cover_s(self) -> float:
        """How long after a blind answer's request the portal surely counts as blind: one heartbeat interval."""
        return self.backoff.max_s

    def silence(self) -> float:
        """Seconds of silence as the portal counts it: since the last accepted heartbeat, less blind time."""
        return self.clock() - self.last_contact - self.paused_s

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST, or None when the portal is unreachable or blind (then every call waits for the backoff).

        A 4xx raises PortalError: the portal answered and refused this call."""
        assert self.client is not None
        kind = path.rsplit("/", 1)[-1]  # heartbeat, status, logs, drain
        stats = self.stats.setdefault(kind, CallStats())
        if self.before_call is not None:
            self.before_call()
        began = time.monotonic()
        sent_at = self.clock()
        try:
            answer = self.client.post(path, body)
        except PortalBlind as exc:
            stats.blind += 1
            now = self.clock()
            if self.last_blind_at is not None and self.blind_sent_at is not None:
                if exc.blind_since is not None and exc.blind_since == self.blind_streak:
                    # One streak at the portal: it counts everything between its two answers as blind,
                    # a slow call included (a database that takes its connect timeout to refuse).
                    self.paused_s += max(0.0, now - self.last_blind_at)
                else:
                    # Paused from the previous blind answer to this one, never past what the portal counts.
                    self.paused_s += max(0.0, min(now, self.blind_sent_at + self.cover_s) - self.last_blind_at)
            self.last_blind_at, self.blind_sent_at = now, sent_at
            self.blind_streak = exc.blind_since
            self._wait(f"{exc} on {path}; workloads keep running", retry_after=exc.retry_after_s)
            return None
        except PortalUnreachable as exc:
            stats.unreachable += 1
            self.last_blind_at = self.blind_sent_at = self.blind_streak = None  # nothing is known of the time since: it counts
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
        now = self.clock()
        self.longest_silence_s = max(self.longest_silence_s, now - self.last_contact - self.paused_s)
        self.longest_gap_s = max(self.longest_gap_s, now - self.last_contact)
        self.last_contact = now
        self.paused_s = 0.0
        self.last_blind_at = self.blind_sent_at = self.blind_streak = None
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
            # Not sooner than asked (unless that is past the cap), spread over up to half as much again.
            cap = self.backoff.max_s
            delay = self.backoff.rng.uniform(min(retry_after, 0.75 * cap), min(cap, 1.5 * retry_after))
        self.retry_at = now + delay
        if now - self._logged_at >= _LOG_EVERY_S:
            self._logged_at = now
            self.log.warning("%s; retrying in %.1f s; silent for %.0f s as the portal counts it", message, delay, self.silence())
