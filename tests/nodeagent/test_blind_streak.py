"""The agent's silence clock pauses for exactly what the portal counts as blind: between two answers of
one blind streak (the same ``blind_since``) all of the time, slow calls included; otherwise no more than
one heartbeat interval after the earlier call went out."""

from __future__ import annotations

import logging
from typing import Any

from nodeagent.client import PortalBlind
from nodeagent.link import PortalLink


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _SlowBlindPortal:
    """Answers every call "unavailable" after `call_s` of the clock, naming `since` as its streak."""

    def __init__(self, clock: _Clock, call_s: float, since: list[float | None]) -> None:
        self.clock, self.call_s, self.since = clock, call_s, since

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.clock.now += self.call_s
        raise PortalBlind("portal unavailable (HTTP 503)", 5.0, self.since.pop(0))


def _link(clock: _Clock, portal: _SlowBlindPortal) -> PortalLink:
    link = PortalLink(log=logging.LoggerAdapter(logging.getLogger("test")), clock=clock, max_backoff_s=0.5)
    link.client = portal  # type: ignore[assignment]
    return link


def _silence_after_calls(since: list[float | None], *, call_s: float = 3.0) -> float:
    clock = _Clock()
    link = _link(clock, _SlowBlindPortal(clock, call_s, since))
    for _ in range(len(since)):
        assert link.call("/api/agent/v1/heartbeat", {}) is None
        clock.now += 0.5  # the backoff
    return link.silence()


def test_answers_of_one_streak_pause_the_clock_however_slow_each_call_is():
    # Ten 3-second calls: 35 s pass; all but the first call (before any blind answer) and the last wait is blind.
    silence = _silence_after_calls([1000.5] * 10)
    assert silence <= 3.0 + 0.5 + 1e-6


def test_answers_without_a_streak_pause_at_most_one_interval_each():
    silence = _silence_after_calls([None] * 10)
    assert silence >= 35.0 - 9 * 0.5 - 1e-6  # each gap paused at most the 0.5 s interval


def test_a_new_streak_is_not_taken_for_the_old_one():
    # Every answer names a different streak: the portal split them, and the gaps between are not paused.
    silence = _silence_after_calls([1000.0 + i for i in range(10)])
    assert silence >= 35.0 - 9 * 0.5 - 1e-6


def test_the_link_keeps_its_longest_silence_and_gap_between_accepted_heartbeats():
    import logging

    from nodeagent.link import PortalLink

    now = [100.0]
    link = PortalLink(log=logging.LoggerAdapter(logging.getLogger("t"), {}), clock=lambda: now[0], max_backoff_s=10.0)
    now[0] = 130.0
    link.paused_s = 12.0  # the portal said it was blind for 12 s of those 30
    link.heartbeat_accepted()
    now[0] = 140.0
    link.heartbeat_accepted()
    assert (link.longest_silence_s, link.longest_gap_s) == (18.0, 30.0)
