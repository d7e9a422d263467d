"""GET /healthz: what a load balancer and an operator ask of the portal.

The body names each dependency, ``{"status": "ok"|"degraded", "database": "ok", "cache": "ok",
"broker": "ok"}``, a failed one as ``"error: ..."``. Only the database is essential: without it no
request can be served, so /healthz answers 503 (JSON, Retry-After, ``"code": "unavailable"``, as
every API does in an outage) and a load balancer takes the web host out. Without Redis the portal
still serves (throttles and the cycle kick degrade, the worker waits for its broker), so the cache and
the broker only turn ``status`` to ``"degraded"`` with a 200: taking every web host out for a Redis
outage would turn a degraded portal into a dead one. Each probe is bounded (the database's timeouts,
portal/env.py; the cache's socket timeouts, portal/settings.py; 1 s for the broker).
"""

from __future__ import annotations

import json

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse

from portal.middleware import DATABASE_DOWN, unavailable


def _error(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:200]


def _cache() -> str:
    try:
        cache.get("yard:healthz")
    except Exception as exc:  # any backend's failure is the answer here
        return _error(exc)
    return "ok"


def _broker() -> str:
    url = str(getattr(settings, "CELERY_BROKER_URL", "") or "")
    if not url.startswith(("redis://", "rediss://")):
        return "ok"  # the demo's filesystem broker: a folder, there whenever the portal is
    try:
        import redis

        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        return _error(exc)
    return "ok"


def healthz(request: HttpRequest) -> HttpResponse:
    """200 while the database answers (cache and broker reported, not required); 503 JSON with
    Retry-After while it does not."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except DATABASE_DOWN as exc:
        response = unavailable(request, exc)
        body = json.loads(response.content)
        body.update({"status": "unavailable", "database": _error(exc), "cache": _cache(), "broker": _broker()})
        response.content = json.dumps(body).encode()
        return response
    checks = {"database": "ok", "cache": _cache(), "broker": _broker()}
    status = "ok" if all(value == "ok" for value in checks.values()) else "degraded"
    return JsonResponse({"status": status, **checks})
