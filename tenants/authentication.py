"""DRF authentication by bearer API token (personal or team service account).

Repeated bad tokens from one address lock that address out for a while (tenants/lockout.py), as
repeated wrong passwords do (django-axes): a token guesser gets 429s, not answers.
"""

from __future__ import annotations

from typing import Any

from rest_framework import authentication, exceptions
from rest_framework.request import Request

from tenants.lockout import bad_token_seen, bad_token_wait, client_ip
from tenants.models import ApiToken
from tenants.services import token_authenticate


class TokensLockedOut(exceptions.Throttled):
    default_code = "locked_out"


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
        ip = client_ip(request._request) or "unknown"
        wait = bad_token_wait(ip)
        if wait is not None:
            raise TokensLockedOut(
                wait=wait,
                detail=f"Too many invalid API tokens from your address: try again in {wait} s, with a valid token "
                "(make one on the API tokens page of the portal, /tokens/)",
            )
        token = token_authenticate(raw=raw)
        if token is None:
            bad_token_seen(ip)
            raise exceptions.AuthenticationFailed(
                "Invalid, revoked or expired token; create a new one on the API tokens page of the portal (/tokens/)"
            )
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
