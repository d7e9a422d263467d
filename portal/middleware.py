"""Answers for the two failures no view should turn into a 500: the database is unreachable, and a
request body is larger than the portal accepts.

During a database outage every API (the user API, the agent API, /healthz) answers 503 JSON with
Retry-After, and pages a short 503 page; never a 500 or a debug page. The agent API's 503 carries
``"code": "unavailable"``: an agent that gets it knows the portal is alive and blind, and pauses its
own silence clock (docs/agent-api.md, *What the portal counts as silence*), while the liveness check,
which cannot run without the database either, counts the outage as time it could not observe.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from typing import cast

from csp.middleware import CSPMiddleware
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from portal.pg.base import budget

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
# Where the web tier records that it answered "blind" (the liveness check reads them: an agent told
# "unavailable" pauses its silence clock, so the portal must not count that time either).
BLIND_SINCE_KEY = "yard:web-blind:since"
BLIND_LATEST_KEY = "yard:web-blind:latest"
# psycopg's and sqlite3's "server gone" errors arrive as these two, and so do a statement the server
# cancelled at statement_timeout (psycopg's QueryCanceled is an OperationalError) and a round trip past
# the client's deadline (portal/pg/base.py); an IntegrityError or a ProgrammingError is a bug or bad
# input, not an outage, and keeps its usual handling.
DATABASE_DOWN = (OperationalError, InterfaceError)
# Redis unreachable or too slow (the cache's socket timeouts, portal/settings.py). What needs Redis
# degrades where it is used; this is the safety net that keeps the rest from becoming a 500.
try:
    from redis.exceptions import ConnectionError as _RedisConnectionError
    from redis.exceptions import TimeoutError as _RedisTimeoutError

    CACHE_DOWN: tuple[type[BaseException], ...] = (_RedisConnectionError, _RedisTimeoutError)
except ImportError:  # pragma: no cover - redis is a dependency; the SQLite demo does not use it
    CACHE_DOWN = ()


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/") or request.path == "/healthz" or request.path == "/metrics"


def _json(status: int, body: dict[str, object]) -> HttpResponse:
    return HttpResponse(json.dumps(body), status=status, content_type="application/json")


def _record_blind() -> float | None:
    """Note in the shared cache that the web tier cannot see (Redis in deployments, the file cache on the
    demo) and answer when this blind streak began; None if even that failed, and then agents are not
    told to pause their silence clocks. The streak's start goes into the answer (``blind_since``): an
    agent that gets two answers of one streak knows the portal counts all the time between them as
    blind (scheduling/agent/liveness.py, _web_blind), however long the calls took."""
    from django.core.cache import cache

    now = time.time()
    try:
        cache.add(BLIND_SINCE_KEY, now, timeout=24 * 3600)
        cache.set(BLIND_LATEST_KEY, now, timeout=24 * 3600)
        since = cache.get(BLIND_SINCE_KEY)
    except Exception:
        log.warning("cannot record the web tier's blindness in the cache", exc_info=True)
        return None
    return float(since) if since is not None else now


def _blind_body(code: str, message: str, since: float | None) -> dict[str, object]:
    body: dict[str, object] = {"code": code, "message": message, "fields": {}}
    if since is not None:
        body["blind_since"] = since
    return body


def unavailable(request: HttpRequest, exc: BaseException | None = None) -> HttpResponse:
    message = "The portal's database is unreachable; nothing was changed. Retry in a few seconds."
    if CACHE_DOWN and isinstance(exc, CACHE_DOWN):
        message = "The portal's cache (Redis) is unreachable; nothing was changed. Retry in a few seconds."
    if _is_api(request):
        # "unavailable" is a promise to the agents (docs/agent-api.md): only make it once it is recorded.
        since = _record_blind()
        code = "unavailable" if since is not None else "unavailable_unrecorded"
        response = _json(503, _blind_body(code, message, since))
    else:
        response = HttpResponse(
            "<!doctype html><title>Yardmaster: unavailable</title><h1>Unavailable for a moment</h1>"
            f"<p>{message}</p><p>Running jobs are not affected.</p>",
            status=503,
            content_type="text/html",
        )
    # Jittered (5-7 s), so clients turned away together do not all come back in the same second.
    response["Retry-After"] = str(RETRY_AFTER_S + random.randint(0, 2))
    return response


def overloaded(request: HttpRequest, *, retry_after_s: float, status: int = 503) -> HttpResponse:
    """The answer to a request the portal sheds (503, or 429 for a client over its share), with
    Retry-After jittered from `retry_after_s`. To an agent, ``"code": "overloaded"`` is the promise that
    the portal counts this time as blind, not as the node's silence (docs/agent-api.md): the agent takes
    it as an answer and does not fence, so the time is recorded first, as for a database outage."""
    agent = request.path.startswith("/api/agent/")
    since = _record_blind() if agent else None
    message = "The portal is overloaded and did not take this request; nothing was changed. Retry after Retry-After."
    code = "overloaded" if since is not None or not agent else "overloaded_unrecorded"
    if _is_api(request):
        response = _json(status, _blind_body(code, message, since))
    else:
        response = HttpResponse(
            "<!doctype html><title>Yardmaster: busy</title><h1>Busy for a moment</h1>"
            "<p>The portal is overloaded and did not take this request; nothing was changed. Reload in a few seconds.</p>",
            status=status,
            content_type="text/html",
        )
    response["Retry-After"] = str(max(1, round(retry_after_s * random.uniform(1.0, 1.5))))
    return response


def too_large(request: HttpRequest) -> HttpResponse:
    from django.conf import settings

    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    message = f"The request body is larger than the portal accepts ({limit} bytes); send less per request."
    if _is_api(request):
        # The agent API names field errors "errors", the user API "fields" (each API's own shape).
        key = "errors" if request.path.startswith("/api/agent/") else "fields"
        return _json(413, {"code": "too_large", "message": message, key: {"body": [message]}})
    return HttpResponse(message, status=413, content_type="text/plain")


AGENT_PATH = "/api/agent/v1/"
HEARTBEAT_PATH = AGENT_PATH + "heartbeat"


def agent_budget_s() -> float:
    """How long an agent's call (a heartbeat above all) may wait on the database in all: inside the
    agent's HTTP timeout, which is at most 0.8 x (fence_after_s - heartbeat_interval_s)
    (nodeagent/config.py), so that a slow database reaches the agent as a prompt "unavailable" (counted
    blind) rather than as its own timeout (counted as silence). 4 s at the default limits;
    YARD_AGENT_DB_BUDGET_S overrides."""
    yard = cast(dict[str, float], settings.YARD)
    if configured := yard.get("AGENT_DB_BUDGET_S"):
        return float(configured)
    room = float(yard["AGENT_FENCE_AFTER_S"]) - float(yard["HEARTBEAT_INTERVAL_S"])
    return max(min(4.0, 0.5 * room), 0.2)


def web_inflight_limit() -> int:
    """How many requests one web worker process works on at once, heartbeats aside (0: no bound).
    portal/gunicorn.conf.py sets YARD_WEB_INFLIGHT to its threads less one: one thread is always left
    for the agents' heartbeats. Django's own servers (tests, `manage.py runserver`) leave it unset."""
    raw = os.environ.get("YARD_WEB_INFLIGHT", "")
    return int(raw) if raw.isdigit() else 0


def _until_deadline(request: HttpRequest) -> float | None:
    """Seconds left until an agent's call's X-Yard-Deadline (the portal's clock, nodeagent/client.py),
    past which its agent no longer waits for the answer and counts the call as silence; None: none given."""
    if not request.path.startswith(AGENT_PATH):
        return None
    # From META, not request.headers: that builds a dict of every header on first use, a cost on each heartbeat.
    raw = request.META.get("HTTP_X_YARD_DEADLINE")
    if not raw:
        return None
    try:
        deadline = float(raw)
    except ValueError:
        return None
    return deadline - time.time() if math.isfinite(deadline) else None


def past_deadline(request: HttpRequest) -> bool:
    left = _until_deadline(request)
    return left is not None and left <= 0


class AdmissionMiddleware:
    """Sheds what a web worker cannot start at once, so nothing queues into its client's timeout.

    Each gunicorn worker has a fixed pool of threads; a request that finds them all busy waits in the
    worker's queue, and under load (a thundering herd, a burst of CI submissions, a slow database)
    heartbeats waited there behind submissions until the agents' HTTP timeout, which agents count as
    silence. Here a worker works on at most ``web_inflight_limit()`` requests at once besides
    heartbeats and /healthz, which are always taken: the rest get a fast 503 ``overloaded`` with a
    jittered Retry-After (an agent's is recorded blind first, as docs/agent-api.md promises), and the
    thread is free again in a millisecond, so a heartbeat always finds one. Counted per process.

    Heartbeats too can outnumber what the web tier serves (a restart's herd, a starved machine): then
    they wait in the queue, and one that is picked up past the deadline its agent named is answered
    "overloaded" unread, before its agent's timeout, instead of being worked on for nobody (CoDel's
    idea: drop what has queued too long). The agent then pauses its silence clock, and the queue drains.
    """

    ALWAYS = frozenset({HEARTBEAT_PATH, "/healthz"})

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self.limit = web_inflight_limit()
        self.lock = threading.Lock()
        self.busy = 0
        self.shed = 0  # since the process started (the bench reads the access log's 503s)
        self.late = 0  # agent calls that arrived past their deadline

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if past_deadline(request):
            # It waited in the queue until its agent has given up on it: the work would be wasted, and
            # an answer now still reaches the agent (it sets the deadline before its own timeout).
            with self.lock:
                self.late += 1
            return overloaded(request, retry_after_s=1.0)
        if not self.limit or request.path in self.ALWAYS:
            return self.get_response(request)
        with self.lock:
            admitted = self.busy < self.limit
            if admitted:
                self.busy += 1
            else:
                self.shed += 1
        if not admitted:
            return overloaded(request, retry_after_s=1.0)
        try:
            return self.get_response(request)
        finally:
            with self.lock:
                self.busy -= 1


class FaultAnswersMiddleware:
    """503 for a database outage, 413 for an oversized body, whichever view (or DRF) raised it."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(AGENT_PATH):
            # An agent's call answers within its budget, slow database or not (portal.pg.base.budget):
            # every one of them holds a web thread the heartbeats need.
            seconds = agent_budget_s()
            if (left := _until_deadline(request)) is not None:
                seconds = max(min(seconds, left), 0.2)  # and no longer than its agent still waits
            with budget(seconds):
                return self.get_response(request)
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        return fault_answer(request, exception)


def fault_answer(request: HttpRequest, exception: Exception) -> HttpResponse | None:
    """FaultAnswersMiddleware's answer to what a view raised: 503 for the database or the cache, 413 for
    a body too large; None for anything else (Django's own handling)."""
    if isinstance(exception, DATABASE_DOWN):
        log.warning("database unreachable on %s %s: %s", request.method, request.path, exception)
        return unavailable(request, exception)
    if CACHE_DOWN and isinstance(exception, CACHE_DOWN):
        log.warning("cache unreachable on %s %s: %s", request.method, request.path, exception)
        return unavailable(request, exception)
    if isinstance(exception, RequestDataTooBig):
        return too_large(request)
    return None


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, minus the agent API: node agents read those JSON answers and no browser
    renders them, so a policy there protects nothing, and building it (twice a response: the policy and
    the report-only one) was 6 % of a heartbeat's CPU, the call every node makes every few seconds."""

    def process_request(self, request: HttpRequest) -> None:
        if not request.path_info.startswith(AGENT_PATH):
            super().process_request(request)

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if request.path_info.startswith(AGENT_PATH):
            return response
        return super().process_response(request, response)


class QueryCountMiddleware:
    """For benchmarks only (YARD_QUERY_COUNT_HEADER=1 adds it): how many SQL statements a request ran, in
    an X-Yard-Queries header, so a load generator can report queries per heartbeat from outside."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        from django.db import connection

        count = [0]

        def counting(execute: Callable[..., object], sql: str, params: object, many: bool, context: object) -> object:
            count[0] += 1
            return execute(sql, params, many, context)

        with connection.execute_wrapper(counting):
            response = self.get_response(request)
        response["X-Yard-Queries"] = str(count[0])
        return response
