"""mozilla-django-oidc's backend with the endpoints from discovery, stricter ID-token checks, and
every failure turned into a message on the sign-in page instead of an exception (a 500).

mozilla-django-oidc checks the signature, expiry and nonce of the ID token; it checks neither its
issuer nor its audience, so this backend does (OpenID Connect Core §3.1.3.7, steps 2 and 3).
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from sso.discovery import ProviderMetadata, SsoUnavailable, provider_metadata, sso_settings
from sso.services import SsoRefused, sso_sign_in

log = logging.getLogger(__name__)


def _token_error(exc: requests.HTTPError) -> str:
    response = exc.response
    code = ""
    if response is not None:
        try:
            body = response.json()
            code = str(body.get("error", "")) if isinstance(body, dict) else ""
        except ValueError:
            code = ""
    if code == "invalid_client" or (response is not None and response.status_code == 401):
        return (
            "Single sign-on failed: the identity provider refused Yardmaster's client credentials (invalid_client). "
            "Tell your administrator to check YARD_OIDC_CLIENT_ID and YARD_OIDC_CLIENT_SECRET."
        )
    if code == "invalid_grant":
        return "Single sign-on failed: the sign-in code was refused or had expired. Please sign in again."
    status = response.status_code if response is not None else "?"
    return f"Single sign-on failed: the identity provider answered HTTP {status}{f' ({code})' if code else ''}. Please try again."


class YardOidcBackend(OIDCAuthenticationBackend):  # type: ignore[misc]  # the library ships no types
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Django makes a backend for every request of a signed-in user (get_user): nothing here may
        # reach the network or require SSO to be configured. Endpoints are set in authenticate().
        from django.contrib.auth import get_user_model

        self.UserModel = get_user_model()
        self.OIDC_RP_SIGN_ALGO = import_from_settings("OIDC_RP_SIGN_ALGO", "RS256")
        self.OIDC_RP_IDP_SIGN_KEY = None
        self.metadata: ProviderMetadata | None = None

    def _configure(self, metadata: ProviderMetadata) -> None:
        config = sso_settings()
        self.metadata = metadata
        self.OIDC_OP_TOKEN_ENDPOINT = metadata.token_endpoint
        self.OIDC_OP_USER_ENDPOINT = metadata.userinfo_endpoint
        self.OIDC_OP_JWKS_ENDPOINT = metadata.jwks_uri
        self.OIDC_RP_CLIENT_ID = config.client_id
        self.OIDC_RP_CLIENT_SECRET = config.client_secret

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        if attr == "OIDC_TOKEN_USE_BASIC_AUTH":
            # As the provider advertises; client_secret_basic where it lists both (or none).
            try:
                return provider_metadata().token_auth_basic
            except SsoUnavailable:
                return True
        return import_from_settings(attr, *args)

    def verify_token(self, token: str, **kwargs: Any) -> Any:
        payload = super().verify_token(token, **kwargs)
        if "nonce" in kwargs and self.metadata is not None:  # the ID token (userinfo JWTs carry no nonce)
            if str(payload.get("iss", "")).rstrip("/") != self.metadata.issuer.rstrip("/"):
                raise SuspiciousOperation(f"ID token issued by {payload.get('iss')!r}, not {self.metadata.issuer!r}")
            audience = payload.get("aud")
            audiences = audience if isinstance(audience, list) else [audience]
            if self.OIDC_RP_CLIENT_ID not in audiences:
                raise SuspiciousOperation("ID token not issued for this client (aud)")
            self.id_claims = dict(payload)
        return payload

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(claims.get("sub"))

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict[str, Any]) -> User | None:
        userinfo = self.get_userinfo(access_token, id_token, payload) if self.OIDC_OP_USER_ENDPOINT else {}
        # Some providers (Entra ID) put groups in the ID token only: merge, with userinfo winning, but the
        # subject must be the ID token's (Core §5.3.2: a userinfo sub that differs must not be used).
        if userinfo.get("sub") not in (None, payload.get("sub")):
            raise SuspiciousOperation("userinfo is for another subject than the ID token")
        claims = {**payload, **userinfo}
        assert self.metadata is not None
        outcome = sso_sign_in(issuer=self.metadata.issuer, claims=claims)
        if outcome.refused:
            raise SsoRefused(outcome.refused)
        return outcome.user

    def authenticate(self, request: HttpRequest | None, **kwargs: Any) -> User | None:
        if request is None or "code" not in request.GET or "state" not in request.GET:
            return None  # not an OIDC callback: a password sign-in, left to ModelBackend
        try:
            self._configure(provider_metadata())
            user: User | None = super().authenticate(request, **kwargs)
        except SsoUnavailable as exc:
            messages.error(request, str(exc))
            return None
        except SsoRefused as exc:
            messages.error(request, str(exc))
            return None
        except requests.HTTPError as exc:
            log.warning("OIDC token or userinfo request failed: %s", exc)
            messages.error(request, _token_error(exc))
            return None
        except requests.RequestException as exc:
            log.warning("OIDC provider unreachable during sign-in: %s", exc)
            messages.error(
                request,
                f"Single sign-on failed: the identity provider could not be reached ({type(exc).__name__}). Please try again.",
            )
            return None
        except SuspiciousOperation as exc:
            log.warning("OIDC sign-in rejected: %s", exc)
            messages.error(
                request, f"Single sign-on failed: the identity provider's answer did not check out ({exc}). Please sign in again."
            )
            return None
        if user is None:
            messages.error(request, "Single sign-on failed: your account could not be verified. Please sign in again.")
        return user
