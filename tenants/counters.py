"""Atomic fixed-window counters: the per-token API rate limit (scheduling/api/permissions.py) and the
per-address sign-in limit (tenants/lockout.py) count here, so parallel requests can never both read
"one left" and both get in.

``hit(name, window_s)`` counts one event and answers how many the window holds with it and how long
the window has left. The first hit opens the window; it ends window_s later, whatever comes after
(a fixed window: at a boundary a client may get up to twice the limit within window_s, never more
than the limit within one window).

Where the cache is Redis (REDIS_URL), one Lua script does INCR and, for the first hit, PEXPIRE, in one
step on the server. Elsewhere (the SQLite demo; PostgreSQL without Redis, whose file cache has no
atomic increment across processes) a database row does it: one INSERT … ON CONFLICT DO UPDATE SET
count = count + 1 … RETURNING, which SQLite (3.35+) and PostgreSQL both run atomically, in its own
autocommit statement on a connection of its own, so it holds no row lock for the rest of a request.

A counter that cannot count (Redis down or hung, the database unreachable) answers None: the caller
lets the request through (a rate limit is no reason to refuse all work while Redis is away), and the
first such failure in a process is logged, not every one.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache
from django.db import DatabaseError, connections, transaction
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

_HIT = """
local n = redis.call('INCR', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if n == 1 or ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  ttl = tonumber(ARGV[1])
end
return {n, ttl}
"""
_UNHIT = """
if redis.call('EXISTS', KEYS[1]) == 1 and tonumber(redis.call('GET', KEYS[1])) > 0 then
  return redis.call('DECR', KEYS[1])
end
return 0
"""
_PEEK = """
local n = redis.call('GET', KEYS[1])
if not n then return {0, 0} end
return {tonumber(n), redis.call('PTTL', KEYS[1])}
"""

_TABLE = "yard_rate_counter"
_DB_HIT = f"""
INSERT INTO {_TABLE} (name, count, expires_at) VALUES (%s, 1, %s)
ON CONFLICT (name) DO UPDATE SET
  count = CASE WHEN {_TABLE}.expires_at <= %s THEN 1 ELSE {_TABLE}.count + 1 END,
  expires_at = CASE WHEN {_TABLE}.expires_at <= %s THEN excluded.expires_at ELSE {_TABLE}.expires_at END
RETURNING count, expires_at
"""
_DB_ALIAS = "default"


@dataclass(frozen=True)
class Count:
    count: int  # events in the window, this one included
    reset_s: float  # seconds until the window ends


_failed_once = threading.Event()


def _degraded(what: str, exc: Exception) -> None:
    if not _failed_once.is_set():
        _failed_once.set()
        logger.warning("rate counter unavailable (%s: %s): requests are let through uncounted until it is back", what, exc)


_FAILURES = (RedisError, DatabaseError, OSError)


def _redis() -> Any | None:
    """The raw client of the default cache where that is Redis, else None."""
    cache = caches["default"]
    if not isinstance(cache, RedisCache):
        return None
    return cache._cache.get_client(None, write=True)  # type: ignore[attr-defined]


def _key(name: str) -> str:
    return caches["default"].make_and_validate_key(f"yard:rate:{name}")


def _ok() -> None:
    if _failed_once.is_set():  # back: a later outage is logged again
        _failed_once.clear()
        logger.warning("rate counter back: counting again")


def hit(name: str, window_s: float) -> Count | None:
    """Count one event of ``name``; None where no counter could (the caller lets the event through)."""
    window_ms = max(1, math.ceil(window_s * 1000))
    try:
        client = _redis()
        if client is not None:
            n, ttl_ms = client.eval(_HIT, 1, _key(name), window_ms)
            counted = Count(count=int(n), reset_s=max(0, int(ttl_ms)) / 1000)
        else:
            counted = _db_hit(name, window_s)
    except _FAILURES as exc:  # Redis down or hung, the database unreachable: degrade, never a 500
        _degraded(type(exc).__name__, exc)
        return None
    _ok()
    return counted


def unhit(name: str) -> None:
    """Take one event back (a sign-in that succeeded after all); never below 0, never opens a window."""
    try:
        client = _redis()
        if client is not None:
            client.eval(_UNHIT, 1, _key(name))
            return
        with connections[_DB_ALIAS].cursor() as cursor:
            cursor.execute(
                f"UPDATE {_TABLE} SET count = count - 1 WHERE name = %s AND count > 0 AND expires_at > %s", [name, time.time()]
            )
    except _FAILURES as exc:
        _degraded(type(exc).__name__, exc)


def peek(name: str) -> Count:
    """The count of ``name``'s window now, without counting (0 where none is open or none can be read)."""
    try:
        client = _redis()
        if client is not None:
            n, ttl_ms = client.eval(_PEEK, 1, _key(name))
            return Count(count=int(n), reset_s=max(0, int(ttl_ms)) / 1000)
        with connections[_DB_ALIAS].cursor() as cursor:
            now = time.time()
            cursor.execute(f"SELECT count, expires_at FROM {_TABLE} WHERE name = %s AND expires_at > %s", [name, now])
            row = cursor.fetchone()
        return Count(count=int(row[0]), reset_s=float(row[1]) - now) if row else Count(0, 0.0)
    except _FAILURES as exc:
        _degraded(type(exc).__name__, exc)
        return Count(0, 0.0)


def _db_hit(name: str, window_s: float) -> Count:
    now = time.time()
    # A savepoint inside a caller's transaction, so a failed statement does not break it; on its own an
    # autocommit transaction of the one statement (no row lock held past it).
    with transaction.atomic(using=_DB_ALIAS), connections[_DB_ALIAS].cursor() as cursor:
        cursor.execute(_DB_HIT, [name, now + window_s, now, now])
        count, expires_at = cursor.fetchone()
    # Another request that read its clock after this one may have opened the window first: its end is
    # then a little past now + window_s, and a window never lasts longer than window_s.
    return Count(count=int(count), reset_s=min(window_s, max(0.0, float(expires_at) - now)))
