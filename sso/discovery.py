"""The provider's endpoints, from its /.well-known/openid-configuration (OpenID Connect Discovery 1.0).

Fetched when someone signs in, never at start-up: an identity provider that is down must cost a
clear message on the sign-in page, not a portal that will not start. A good document is cached for an
hour in the shared cache; a failure is not cached, so the next attempt tries again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import requests
from django.conf import settings
from django.core.cache import cache

CACHE_S = 3600


class SsoUnavailable(Exception):
    """The provider cannot be used now; the message is for the person at the sign-in page."""


@dataclass(frozen=True)
class SsoSettings:
    issuer: str
    client_id: str
    client_secret: str
    scopes: str
    groups_claim: str
    username_claim: str
    provider_name: str
    local_login: bool

    @property
    def enabled(self) -> bool:
        return bool(self.issuer and self.client_id)


def sso_settings() -> SsoSettings:
    """Read at each use (not at import), so a test's settings override reaches every request."""
    return SsoSettings(
        issuer=getattr(settings, "OIDC_OP_ISSUER", "").rstrip("/"),
        client_id=getattr(settings, "OIDC_RP_CLIENT_ID", ""),
        client_secret=getattr(settings, "OIDC_RP_CLIENT_SECRET", ""),
        scopes=getattr(settings, "OIDC_RP_SCOPES", "openid email profile"),
        groups_claim=getattr(settings, "YARD_OIDC_GROUPS_CLAIM", "groups"),
        username_claim=getattr(settings, "YARD_OIDC_USERNAME_CLAIM", "preferred_username"),
        provider_name=getattr(settings, "YARD_OIDC_PROVIDER_NAME", "") or "your identity provider",
        local_login=getattr(settings, "YARD_LOCAL_LOGIN", True),
    )


@dataclass(frozen=True)
class ProviderMetadata:
    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    userinfo_endpoint: str
    jwks_uri: str
    token_auth_methods: tuple[str, ...]
    signing_algs: tuple[str, ...]

    @property
    def token_auth_basic(self) -> bool:
        # client_secret_basic is the default method when a provider lists none (OIDC Discovery §3).
        return "client_secret_basic" in self.token_auth_methods or not self.token_auth_methods


def _fetch(issuer: str) -> ProviderMetadata:
    url = f"{issuer}/.well-known/openid-configuration"
    timeout = getattr(settings, "OIDC_TIMEOUT", 10)
    try:
        response = requests.get(url, timeout=timeout, verify=getattr(settings, "OIDC_VERIFY_SSL", True))
    except requests.RequestException as exc:
        raise SsoUnavailable(
            f"Single sign-on is unavailable: the identity provider at {issuer} cannot be reached "
            f"({type(exc).__name__}). Try again later, or tell your administrator (YARD_OIDC_ISSUER)."
        ) from exc
    if response.status_code != 200:
        raise SsoUnavailable(
            f"Single sign-on is unavailable: {url} answered HTTP {response.status_code}. "
            "Tell your administrator: YARD_OIDC_ISSUER must be the provider's issuer URL."
        )
    try:
        doc: dict[str, Any] = response.json()
    except ValueError:
        raise SsoUnavailable(
            f"Single sign-on is unavailable: {url} did not answer with JSON (is YARD_OIDC_ISSUER right?)"
        ) from None
    missing = [k for k in ("issuer", "authorization_endpoint", "token_endpoint", "jwks_uri") if not doc.get(k)]
    if missing:
        raise SsoUnavailable(f"Single sign-on is unavailable: the provider's discovery document lacks {', '.join(missing)}")
    # Discovery §4.3: the document's issuer must be the one we asked; otherwise ID tokens could come from anyone.
    if str(doc["issuer"]).rstrip("/") != issuer:
        raise SsoUnavailable(
            f"Single sign-on is misconfigured: the provider calls itself {doc['issuer']}, not {issuer} "
            "(set YARD_OIDC_ISSUER to exactly the provider's issuer)."
        )
    challenge = doc.get("code_challenge_methods_supported")
    if challenge is not None and "S256" not in challenge:
        raise SsoUnavailable(
            "Single sign-on is misconfigured: the provider does not offer PKCE with S256, which Yardmaster requires."
        )
    return ProviderMetadata(
        issuer=str(doc["issuer"]),
        authorization_endpoint=doc["authorization_endpoint"],
        token_endpoint=doc["token_endpoint"],
        userinfo_endpoint=doc.get("userinfo_endpoint", ""),
        jwks_uri=doc["jwks_uri"],
        token_auth_methods=tuple(doc.get("token_endpoint_auth_methods_supported") or ()),
        signing_algs=tuple(doc.get("id_token_signing_alg_values_supported") or ()),
    )


def provider_metadata() -> ProviderMetadata:
    """The configured provider's endpoints; raises SsoUnavailable with a message for people."""
    config = sso_settings()
    if not config.enabled:
        raise SsoUnavailable("Single sign-on is not configured on this portal (YARD_OIDC_ISSUER and YARD_OIDC_CLIENT_ID).")
    key = f"yard:oidc:discovery:{config.issuer}"
    cached = cache.get(key)
    if isinstance(cached, dict):
        return ProviderMetadata(
            **{**cached, "token_auth_methods": tuple(cached["token_auth_methods"]), "signing_algs": tuple(cached["signing_algs"])}
        )
    metadata = _fetch(config.issuer)
    cache.set(key, asdict(metadata), CACHE_S)
    return metadata
