"""Secrets at rest, sealed under SECRET_KEY: notebook tokens, registry passwords.

AES-SIV (RFC 5297, ``cryptography``) under a key derived from SECRET_KEY and a purpose string, so a
value sealed for one purpose never opens as another's: authenticated (a changed value fails to open),
and deterministic, so the same secret seals to the same text (a heartbeat that repeats a notebook's
token writes nothing). A key in SECRET_KEY_FALLBACKS still opens what was sealed before a rotation.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESSIV
from django.conf import settings


def _key(secret: str, purpose: bytes) -> bytes:
    return hmac.new(secret.encode(), purpose, hashlib.sha512).digest()  # 64 bytes: AES-256-SIV


def seal(value: str, *, purpose: bytes) -> str:
    """``value`` sealed under the current SECRET_KEY, as URL-safe base64 without padding."""
    sealed = AESSIV(_key(settings.SECRET_KEY, purpose)).encrypt(value.encode(), [purpose])
    return base64.urlsafe_b64encode(sealed).decode().rstrip("=")


def open_sealed(text: str, *, purpose: bytes) -> str | None:
    """What ``seal`` sealed, under SECRET_KEY or one of SECRET_KEY_FALLBACKS; None if none opens it."""
    try:
        sealed = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except ValueError:
        return None
    for secret in [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]:
        try:
            return AESSIV(_key(secret, purpose)).decrypt(sealed, [purpose]).decode()
        except (InvalidTag, ValueError):
            continue
    return None
