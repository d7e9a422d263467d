"""Who is asking (the client's address), and the lockout for repeated bad API tokens.

Passwords are django-axes' business (portal/settings.py, AXES_*: a username from one address is locked
out after YARD_LOGIN_FAILURE_LIMIT wrong passwords, for YARD_LOGIN_COOLOFF_MIN). Bad bearer tokens get
the same treatment here, per address: after YARD_TOKEN_FAILURE_LIMIT unknown, revoked or expired tokens
within YARD_TOKEN_LOCKOUT_S, every token request from that address answers 429 with Retry-After until
the cool-off has passed. Counted in the shared cache (Redis in deployments), so every web process sees
the same count.
"""

from __future__ import annotations

import ipaddress
import math
import time
from typing import cast

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest

_COUNT = "yard:bad-token:count:{ip}"
_UNTIL = "yard:bad-token:until:{ip}"


def client_ip(request: HttpRequest) -> str | None:
    """The client's address: REMOTE_ADDR, or behind the deployment's reverse proxy (YARD_BEHIND_PROXY=1)
    the address that proxy appended to X-Forwarded-For (the last one: the ones before it are the
    client's word and could be anything). None where there is none, or it is not an address.
    Also django-axes' AXES_CLIENT_IP_CALLABLE."""
    candidate = str(request.META.get("REMOTE_ADDR") or "")
    if getattr(settings, "SECURE_PROXY_SSL_HEADER", None):
        forwarded = [part.strip() for part in str(request.META.get("HTTP_X_FORWARDED_FOR", "")).split(",") if part.strip()]
        if forwarded:
            candidate = forwarded[-1]
    try:
        return str(ipaddress.ip_address(candidate.strip("[]")))
    except ValueError:
        return None


def _limits() -> tuple[int, float]:
    yard = settings.YARD
    return int(cast(int, yard["TOKEN_FAILURE_LIMIT"])), float(cast(float, yard["TOKEN_LOCKOUT_S"]))


def bad_token_wait(ip: str) -> int | None:
    """Seconds until ``ip`` may try tokens again, or None when it is not locked out."""
    limit, _ = _limits()
    count = cache.get(_COUNT.format(ip=ip)) or 0
    until = cache.get(_UNTIL.format(ip=ip))
    if count < limit or until is None:
        return None
    left = float(until) - time.time()
    return math.ceil(left) if left > 0 else None


def bad_token_seen(ip: str) -> None:
    """Count one bad token from ``ip``; the window (and the lockout) ends YARD_TOKEN_LOCKOUT_S after the first."""
    _, window = _limits()
    timeout = max(1, math.ceil(window))
    cache.add(_UNTIL.format(ip=ip), time.time() + window, timeout=timeout)
    if cache.add(_COUNT.format(ip=ip), 1, timeout=timeout):
        return
    try:
        cache.incr(_COUNT.format(ip=ip))
    except ValueError:  # expired between add and incr: this is the first of a new window
        cache.add(_COUNT.format(ip=ip), 1, timeout=timeout)
