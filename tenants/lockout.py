"""Who is asking (the client's address), and the lockout for repeated bad API tokens.

Passwords are django-axes' business (portal/settings.py, AXES_*: a username from one address is locked
out after YARD_LOGIN_FAILURE_LIMIT wrong passwords, for YARD_LOGIN_COOLOFF_MIN). Bad bearer tokens get
the same treatment here, per address: after YARD_TOKEN_FAILURE_LIMIT unknown, revoked or expired tokens
within YARD_TOKEN_LOCKOUT_S, every token request from that address answers 429 with Retry-After until
the cool-off has passed. And password spraying (many usernames, a guess each, from one address) meets
a per-address limit across usernames (sign_in_address_wait). Both are counted atomically in Redis or,
without it, the database (tenants/counters.py), so every web process sees the same count and parallel
attempts cannot race past a limit; a counter that cannot count lets the attempt through.
"""

from __future__ import annotations

import ipaddress
import math
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.backends import ModelBackend
from django.contrib.auth.signals import user_logged_in
from django.core.exceptions import PermissionDenied
from django.dispatch import receiver
from django.http import HttpRequest

from tenants import counters

_BAD_TOKEN = "bad-token:{ip}"
_SIGN_IN = "sign-in-failed:{ip}"


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
    seen = counters.peek(_BAD_TOKEN.format(ip=ip))
    if seen.count < limit or seen.reset_s <= 0:
        return None
    return math.ceil(seen.reset_s)


def bad_token_seen(ip: str) -> None:
    """Count one bad token from ``ip``; the window (and the lockout) ends YARD_TOKEN_LOCKOUT_S after the first."""
    _, window = _limits()
    counters.hit(_BAD_TOKEN.format(ip=ip), window)


# --------------------------------------------------------------------------- password spraying


def _sign_in_limits() -> tuple[int, float]:
    yard = settings.YARD
    return int(cast(int, yard["SIGN_IN_ADDRESS_LIMIT"])), float(cast(float, yard["SIGN_IN_ADDRESS_WINDOW_S"]))


def sign_in_address_wait(request: HttpRequest | None) -> int | None:
    """Seconds until the request's address may try passwords again, or None while it may.

    A count of failed sign-ins per address across every username (django-axes counts per username and
    address, so 40 usernames x 1 password from one address were never stopped): after
    YARD_SIGN_IN_ADDRESS_LIMIT failures within YARD_SIGN_IN_ADDRESS_WINDOW_S of the first, every
    password sign-in from that address is refused until the window ends. Each attempt takes its place
    in the count before its password is checked (one atomic step, tenants/counters.py), and a success
    gives it back, so parallel guesses cannot slip past the limit; other addresses are untouched.
    """
    ip = client_ip(request) if request is not None else None
    if ip is None:
        return None
    limit, window = _sign_in_limits()
    counted = counters.hit(_SIGN_IN.format(ip=ip), window)
    if counted is None or counted.count <= limit:
        return None
    return max(1, math.ceil(counted.reset_s))


def sign_in_address_succeeded(request: HttpRequest | None) -> None:
    """A sign-in from the address succeeded: its attempt was no failure."""
    ip = client_ip(request) if request is not None else None
    if ip is not None:
        counters.unhit(_SIGN_IN.format(ip=ip))


class AddressLimitBackend:
    """First of AUTHENTICATION_BACKENDS: a password attempt from an address over its limit is refused
    before any backend checks it (PermissionDenied stops django.contrib.auth.authenticate), and the
    lockout page (AXES_LOCKOUT_CALLABLE, portal/lockout.py) says why and for how long."""

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> None:
        if password is None:
            return None  # not a password sign-in (SSO's backend is asked with other credentials)
        wait = sign_in_address_wait(request)
        if wait is not None and request is not None:
            request.yard_address_wait = wait  # type: ignore[attr-defined]
            request.axes_locked_out = True  # type: ignore[attr-defined]  # AxesMiddleware answers with the lockout page
            raise PermissionDenied("too many failed sign-ins from this address")
        if request is not None:
            request.yard_address_counted = True  # type: ignore[attr-defined]
        return None

    def get_user(self, user_id: int) -> Any:
        # Being first of AUTHENTICATION_BACKENDS, this is the backend a session made by login() without
        # one (Client.force_login, a management command) names: it finds the user as ModelBackend does.
        return ModelBackend().get_user(user_id)


@receiver(user_logged_in, dispatch_uid="yard-sign-in-address-success")
def _signed_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    if request is not None and getattr(request, "yard_address_counted", False):
        request.yard_address_counted = False  # type: ignore[attr-defined]
        sign_in_address_succeeded(request)
