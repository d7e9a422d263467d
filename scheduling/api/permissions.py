"""Throttling of token-authenticated requests (CI loops), at the settings' "token" rate."""

from __future__ import annotations

from typing import Any, cast

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle

from tenants.models import ApiToken


class TokenRateThrottle(SimpleRateThrottle):
    """Per token, at REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["token"]; sessions (people) are not throttled.

    The rate is read per request (not at import, as DRF's throttles do), so a deployment's or a
    test's settings apply without a restart.
    """

    scope = "token"

    def get_rate(self) -> str | None:
        rates = cast(dict[str, Any], settings.REST_FRAMEWORK).get("DEFAULT_THROTTLE_RATES", {})
        return cast(str | None, rates.get(self.scope))

    def allow_request(self, request: Request, view: Any) -> bool:
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        token = request.auth
        if not isinstance(token, ApiToken):
            return None
        return self.cache_format % {"scope": self.scope, "ident": token.pk}
