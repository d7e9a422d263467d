"""Throttling of token-authenticated requests (CI loops), at the settings' "token" rate (YARD_TOKEN_THROTTLE).

Every answer to a token tells where it stands, in the IETF draft's headers (draft-ietf-httpapi-ratelimit-headers),
as GitHub's and GitLab's APIs do: ``RateLimit-Limit`` (requests per window), ``RateLimit-Remaining``,
``RateLimit-Reset`` (seconds until the window frees a request) and ``RateLimit-Policy`` (``120;w=60``).
A 429 also carries ``Retry-After``. README: *The API's rate limit*.
"""

from __future__ import annotations

import math
from typing import Any, cast

from django.conf import settings
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle

from tenants.models import ApiToken


class TokenRateThrottle(SimpleRateThrottle):
    """Per token, at REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["token"]; sessions (people) are not throttled.

    The rate is read per request (not at import, as DRF's throttles do), so a deployment's or a
    test's settings apply without a restart. None (YARD_TOKEN_THROTTLE=off) throttles nothing.
    """

    scope = "token"
    applied = False  # this request was counted against a token's rate (so it gets the headers)

    def get_rate(self) -> str | None:
        rates = cast(dict[str, Any], settings.REST_FRAMEWORK).get("DEFAULT_THROTTLE_RATES", {})
        return cast(str | None, rates.get(self.scope))

    def allow_request(self, request: Request, view: Any) -> bool:
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        self.applied = self.rate is not None and self.get_cache_key(request, view) is not None
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = request.auth
        if not isinstance(token, ApiToken):
            return None
        return self.cache_format % {"scope": self.scope, "ident": token.pk}

    def headers(self) -> dict[str, str]:
        """The RateLimit-* headers for this request, after allow_request; {} where no rate applied."""
        if not self.applied or self.num_requests is None or self.duration is None:
            return {}
        history = getattr(self, "history", [])
        remaining = max(0, self.num_requests - len(history))
        # The window frees its oldest request first; a fresh window is whole again at once.
        reset = math.ceil(max(0.0, history[-1] + self.duration - self.now)) if history else 0
        return {
            "RateLimit-Limit": str(self.num_requests),
            "RateLimit-Remaining": str(remaining),
            "RateLimit-Reset": str(reset),
            "RateLimit-Policy": f"{self.num_requests};w={self.duration}",
        }


def add_rate_limit_headers(response: Response, throttles: list[Any]) -> None:
    for throttle in throttles:
        if isinstance(throttle, TokenRateThrottle):
            for name, value in throttle.headers().items():
                response[name] = value
