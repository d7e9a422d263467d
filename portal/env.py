"""Typed readers for environment settings that fail loudly on bad values.

A typo in a deployment's environment must stop the process at start-up with a message
that names the variable and says what to change, never fall back to a silent default.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit


class ImproperlyConfiguredEnv(Exception):
    pass


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None:
        if default is None:
            raise ImproperlyConfiguredEnv(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a boolean; use one of 1/0, true/false, yes/no, on/off")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={value} must be at least {minimum}")
    return value


def env_float(name: str, default: float, *, minimum: float | None = None) -> float:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a number") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfiguredEnv(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_port_range(name: str, default: tuple[int, int]) -> tuple[int, int]:
    """A TCP port range written LOW-HIGH (both included), e.g. 29500-29999."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        low_s, high_s = raw.replace(" ", "").split("-")
        low, high = int(low_s), int(high_s)
    except ValueError:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r} is not a port range; write LOW-HIGH, e.g. 29500-29999") from None
    if not 1024 <= low <= high <= 65535:
        raise ImproperlyConfiguredEnv(f"{name}={raw!r}: ports must satisfy 1024 <= LOW <= HIGH <= 65535")
    return low, high


def env_int_set(name: str, default: frozenset[int]) -> frozenset[int]:
    """A comma-separated set of non-negative integers ("48,79,95"); empty means none."""
    if name not in os.environ:
        return default
    items = env_list(name, [])
    for item in items:
        if not item.isdigit():
            raise ImproperlyConfiguredEnv(
                f"{name}={os.environ[name]!r}: {item!r} is not a non-negative integer; write codes like 48,79,95"
            )
    return frozenset(int(item) for item in items)


def _program() -> str:
    """This process's program: "gunicorn", "celery", "manage.py" (`python -m celery` runs .../celery/__main__.py)."""
    path = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    return path.parent.name if path.name == "__main__.py" else path.name


def postgres_bounds(program: str) -> dict[str, object]:
    """libpq options that bound every wait on PostgreSQL, so a slow, half-open or dead database costs a
    request seconds (a 503) instead of a thread for ever, and a dropped connection is noticed:

    - ``connect_timeout`` (YARD_DB_CONNECT_TIMEOUT_S, 5): the longest a new connection may take, TCP and
      start-up together; a database that accepts and says nothing costs a request this long.
    - ``keepalives``, ``keepalives_idle``/``_interval``/``_count`` (YARD_DB_KEEPALIVES_IDLE_S 10,
      YARD_DB_KEEPALIVES_INTERVAL_S 5, YARD_DB_KEEPALIVES_COUNT 3): an idle pooled connection whose server
      vanished is found dead in about idle + interval x count = 25 s.
    - ``tcp_user_timeout`` (YARD_DB_TCP_USER_TIMEOUT_MS, 10000; libpq >= 12): data sent and not
      acknowledged for this long breaks the connection, which is what frees a query in flight when the
      server's host or the network between goes away (keepalives only probe idle connections).
    - ``statement_timeout`` (YARD_DB_STATEMENT_TIMEOUT_MS): the server cancels a statement that runs (or
      waits for a lock) longer; 15 s in the web tier (a request nobody waits for any more), 120 s in the
      Celery worker (a cycle's statements, under its 240 s soft time limit), 0 (none) for manage.py, whose
      migrations may rightly run long. Set the variable to override whichever default applies.

    A server that acknowledges and never answers (hung, or a proxy that forwards nothing) trips none of
    these; the client-side deadline in portal/pg/base.py (CLIENT_TIMEOUT_S) covers it.
    """
    if "celery" in program:
        default_statement_ms = 120_000
    elif program == "manage.py":
        default_statement_ms = 0
    else:
        default_statement_ms = 15_000
    statement_ms = env_int("YARD_DB_STATEMENT_TIMEOUT_MS", default_statement_ms, minimum=0)
    bounds: dict[str, object] = {
        "connect_timeout": env_int("YARD_DB_CONNECT_TIMEOUT_S", 5, minimum=1),
        "keepalives": 1,
        "keepalives_idle": env_int("YARD_DB_KEEPALIVES_IDLE_S", 10, minimum=1),
        "keepalives_interval": env_int("YARD_DB_KEEPALIVES_INTERVAL_S", 5, minimum=1),
        "keepalives_count": env_int("YARD_DB_KEEPALIVES_COUNT", 3, minimum=1),
        "tcp_user_timeout": env_int("YARD_DB_TCP_USER_TIMEOUT_MS", 10_000, minimum=0),
    }
    if statement_ms:
        bounds["options"] = f"-c statement_timeout={statement_ms}"
    return bounds


def _statement_timeout_ms(libpq_options: str) -> int:
    """The statement_timeout a libpq ``options`` string sets (milliseconds), 0 if none."""
    for word in libpq_options.replace("-c", " ").split():
        if word.startswith("statement_timeout="):
            try:
                return int(word.split("=", 1)[1])
            except ValueError:
                return 0
    return 0


def database_from_url(url: str, *, base_dir: Path) -> dict[str, object]:
    """Turn DATABASE_URL into a Django DATABASES entry (postgres:// or sqlite:///path)."""
    parts = urlsplit(url)
    if parts.scheme in {"postgres", "postgresql", "pgsql"}:
        name = unquote(parts.path.lstrip("/"))
        if not name:
            raise ImproperlyConfiguredEnv(f"DATABASE_URL={url!r} names no database; add /DBNAME to it")
        options: dict[str, object] = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        # Which part of Yardmaster holds a session, in pg_stat_activity (a lock held too long, too many
        # connections): "yardmaster gunicorn 1234", "yardmaster celery 1240". ?application_name= wins.
        program = _program()
        options.setdefault("application_name", f"yardmaster {program[:30]} {os.getpid()}")
        for key, value in postgres_bounds(program).items():
            options.setdefault(key, value)  # ?connect_timeout=... in the URL wins
        statement_ms = _statement_timeout_ms(str(options.get("options", "")))
        return {
            # Django's PostgreSQL backend with a client-side deadline on every round trip (portal/pg/base.py).
            "ENGINE": "portal.pg",
            "NAME": name,
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            "OPTIONS": options,
            "CONN_MAX_AGE": 60,
            "CONN_HEALTH_CHECKS": True,
            # The longest one round trip may take before the client gives up on the connection (portal/pg):
            # by default the statement timeout plus 5 s, so the server's own cancel comes first; with no
            # statement timeout, none. YARD_DB_CLIENT_TIMEOUT_S overrides (0: none).
            "CLIENT_TIMEOUT_S": env_float(
                "YARD_DB_CLIENT_TIMEOUT_S", statement_ms / 1000 + 5 if statement_ms else 0.0, minimum=0
            ),
        }
    if parts.scheme == "sqlite":
        path = url[len("sqlite:///") :] if url.startswith("sqlite:///") else ""
        if not path:
            raise ImproperlyConfiguredEnv(f"DATABASE_URL={url!r}: write sqlite:///relative/or/absolute/path.sqlite3")
        db_path = Path(path) if Path(path).is_absolute() else base_dir / path
        # A busy timeout so the web process, the worker, beat and the agents' requests can share
        # the file; IMMEDIATE transactions take the write lock up front, so a read-then-write
        # transaction never fails half-way with "database is locked".
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": db_path,
            "OPTIONS": {"timeout": 20, "transaction_mode": "IMMEDIATE"},
        }
    raise ImproperlyConfiguredEnv(
        f"DATABASE_URL={url!r} has an unsupported scheme {parts.scheme!r}; use postgres://USER@HOST:PORT/DB or sqlite:///PATH"
    )
