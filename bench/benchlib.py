"""What every bench shares: which checkout's code it measures, and how it reports a figure.

A bench measures the code of ``BENCH_CODE`` (another checkout, or `git archive` of a named commit) when
that is set, else this checkout's. The bench script itself is always this checkout's, so the same
measurement runs over the old code and the new: bench/compare.py runs each bench both ways in one
sitting and prints the ratios (`make bench`).

Each figure is printed as one ``RESULT {json}`` line beside the bench's human-readable output:

    result("heartbeat.cpu_ms_with_samples", 4.1, "ms", better="lower", over="in-process, 1,000-node state")
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
CODE = Path(os.environ.get("BENCH_CODE") or HERE).resolve()
PG = os.environ.get("BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432")


def use_code() -> Path:
    """Import the measured checkout's packages first, and run from inside it: the project is installed
    editable into the virtual environment, whose finder otherwise hands out this checkout's packages
    even with another one first on sys.path."""
    sys.path.insert(0, str(CODE))
    os.chdir(CODE)
    return CODE


def result(name: str, value: float | None, unit: str, *, better: str = "lower", over: str = "") -> None:
    """Print one figure for bench/compare.py; ``value`` None says the measured code cannot do it."""
    if better not in ("lower", "higher"):
        raise ValueError("better is 'lower' or 'higher'")
    line = {"name": name, "value": value, "unit": unit, "better": better, "over": over}
    print("RESULT " + json.dumps(line), flush=True)


def results(text: str) -> list[dict]:
    """The RESULT lines of a bench's output, in order."""
    found = []
    for line in text.splitlines():
        if line.startswith("RESULT "):
            try:
                found.append(json.loads(line[len("RESULT ") :]))
            except json.JSONDecodeError:
                continue
    return found


@contextlib.contextmanager
def django_database(prefix: str, *, keep: str | None = None, **env: str) -> Iterator[tuple[str, bool]]:
    """Django set up in this process over a throwaway PostgreSQL database (or ``keep``: that one, made the
    first time and kept), with the bench's own Redis db; yields (its name, whether it was made now).
    ``env``: more settings (variables), beside the defaults here."""
    import psycopg

    name = keep or f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
        fresh = not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if fresh:
            conn.execute(f'CREATE DATABASE "{name}"')
    os.environ.update(
        {
            "DATABASE_URL": f"{PG}/{name}",
            "REDIS_URL": os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/11"),
            "YARD_VAR_DIR": f"/tmp/{name}-var",
            "SECRET_KEY": "bench-only-secret-key-0123456789abcdef0123456789abcdef",
            "ALLOWED_HOSTS": "testserver",
            "LOG_LEVEL": "WARNING",
            "DEBUG": "0",
            "DJANGO_SETTINGS_MODULE": "portal.settings",
            **env,
        }
    )
    import django

    django.setup()
    try:
        yield name, fresh
    finally:
        from django.db import connections

        connections.close_all()
        if not keep:
            with psycopg.connect(f"{PG}/postgres", autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
