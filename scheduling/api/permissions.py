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

from tenants import counters
from tenants.models import ApiToken


class TokenRateThrottle(SimpleRateThrottle):
    """Per token, at REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["token"]; sessions (people) are not throttled.

    The rate is read per request (not at import, as DRF's throttles do), so a deployment's or a
    test's settings apply without a restart. None (YARD_TOKEN_THROTTLE=off) throttles nothing.
    Counted in a fixed window of the rate's period that opens at the token's first request
    (tenants/counters.py): exactly N requests a window get in, however many clients send them at once.
    """

    scope = "token"
    applied = False  # this request was counted against a token's rate (so it gets the headers)

    def get_rate(self) -> str | None:
        rates = cast(dict[str, Any], settings.REST_FRAMEWORK).get("DEFAULT_THROTTLE_RATES", {})
        return cast(str | None, rates.get(self.scope))

    def allow_request(self, request: Request, view: Any) -> bool:
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        key = self.get_cache_key(request, view) if self.rate is not None else None
        self.counted: counters.Count | None = None
        if key is None or self.num_requests is None or self.duration is None:
            self.applied = False
            return True
        # One atomic count (tenants/counters.py), not DRF's read-modify-write of a history list: under
        # 16 parallel clients that let 29 % more through than the rate. Uncountable (Redis away): let in.
        self.counted = counters.hit(key, self.duration)
        self.applied = self.counted is not None
        return self.counted is None or self.counted.count <= self.num_requests

    def wait(self) -> float | None:
        return math.ceil(self.counted.reset_s) if self.counted is not None else None

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = request.auth
        if not isinstance(token, ApiToken):
            return None
        return self.cache_format % {"scope": self.scope, "ident": token.pk}

    def headers(self) -> dict[str, str]:
        """The RateLimit-* headers for this request, after allow_request; {} where no rate applied."""
        if not self.applied or self.counted is None or self.num_requests is None or self.duration is None:
            return {}
        return {
            "RateLimit-Limit": str(self.num_requests),
            "RateLimit-Remaining": str(max(0, self.num_requests - self.counted.count)),
            # The window is whole again when it ends (a fixed window: tenants/counters.py).
            "RateLimit-Reset": str(math.ceil(self.counted.reset_s)),
            "RateLimit-Policy": f"{self.num_requests};w={self.duration}",
        }


def add_rate_limit_headers(response: Response, throttles: list[Any]) -> None:
    for throttle in throttles:
        if isinstance(throttle, TokenRateThrottle):
            for name, value in throttle.headers().items():
                response[name] = value
