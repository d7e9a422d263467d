"""SECRET_KEY: where it comes from, and the refusal to serve with a weak one.

A deployment sets SECRET_KEY. The zero-setup SQLite demo may leave it unset: it then gets a random key
generated once and kept under var/ (mode 0600), so that it also runs with DEBUG off and its sessions
survive a restart. Outside DEBUG a missing key stops the process at settings time; a weak one stops
the web server, the Celery worker and beat when they start (`serving_refusal`), not at settings time,
so that tooling that only imports the settings (mypy's Django plugin, makemigrations --check) still
runs with a placeholder such as SECRET_KEY=lint.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

DEV_SECRET = "dev-only-insecure-secret-key-do-not-use-in-production-0123456789abcdef"
# Django's own bar for a key (security.W009 of `check --deploy`).
MIN_LENGTH = 50
MIN_UNIQUE = 5
HOW_TO_SET = "set SECRET_KEY to a long random string, e.g. from: python -c 'import secrets; print(secrets.token_urlsafe(50))'"


def demo_secret_key(var_dir: Path) -> str:
    """The demo's generated key, made on first use (mode 0600: other local accounts cannot read it)."""
    path = var_dir / "secret-key"
    try:
        key = path.read_text().strip()
    except FileNotFoundError:
        key = None
    if key is not None and len(key) >= MIN_LENGTH:
        return key
    var_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".secret-key.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(64) + "\n")
    try:
        if key is None:
            # The web server, worker and beat of a first start race here: the first link wins, all read it.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        else:
            os.replace(tmp, path)  # an empty or truncated key file
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path.read_text().strip()


def weakness(key: str) -> str | None:
    """Why `key` is too weak to sign sessions and CSRF tokens with, or None."""
    if key == DEV_SECRET:
        return "SECRET_KEY is the development key"
    if key.startswith("django-insecure"):
        return "SECRET_KEY is one of Django's generated 'django-insecure-' keys"
    if len(key) < MIN_LENGTH:
        return f"SECRET_KEY is {len(key)} characters long; it needs at least {MIN_LENGTH}"
    if len(set(key)) < MIN_UNIQUE:
        return f"SECRET_KEY uses fewer than {MIN_UNIQUE} different characters"
    return None


def serving_refusal() -> str | None:
    """The message to stop a web server, worker or beat with, or None when the key is fine (or DEBUG is on)."""
    from django.conf import settings

    if settings.DEBUG:
        return None
    problem = weakness(settings.SECRET_KEY)
    return f"{problem}, and DEBUG is off: {HOW_TO_SET}" if problem else None


def refuse_to_serve_with_a_weak_key() -> None:
    problem = serving_refusal()
    if problem:
        raise SystemExit(f"yardmaster: {problem}")
