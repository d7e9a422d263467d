"""DRF authentication by bearer API token (personal or team service account)."""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants.models import ApiToken
from tenants.services import token_authenticate


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        if not header:
            return None
        parts = header.split()
        if len(parts) != 2 or parts[0] not in (self.keyword, "Token"):
            return None
        raw = parts[1]
        if not raw.startswith("ym_"):
            return None  # not ours (agent tokens are handled by the agent API)
        token = token_authenticate(raw=raw)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, revoked or expired token; create a new one in your profile")
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
