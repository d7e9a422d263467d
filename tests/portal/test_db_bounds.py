"""Every PostgreSQL connection is bounded (portal/env.py): defaults per process, overrides from the
environment and the URL, and a bad value stops start-up naming the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from portal.env import ImproperlyConfiguredEnv, database_from_url, postgres_bounds

ROOT = Path(__file__).resolve().parents[2]


def test_the_web_tier_gets_every_bound_by_default() -> None:
    db = database_from_url("postgres://u@db.example/yard", base_dir=ROOT)
    options = db["OPTIONS"]
    assert isinstance(options, dict)
    expected = {
        "connect_timeout": 5,
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 5,
        "keepalives_count": 3,
        "tcp_user_timeout": 10000,
        "options": "-c statement_timeout=15000",
    }
    assert {key: options[key] for key in expected} == expected
    assert db["ENGINE"] == "portal.pg" and db["CONN_HEALTH_CHECKS"] is True
    assert db["CLIENT_TIMEOUT_S"] == 20.0  # the server's cancel first, then the client's deadline


def test_the_worker_gets_a_longer_statement_timeout_and_manage_py_none() -> None:
    assert postgres_bounds("celery")["options"] == "-c statement_timeout=120000"
    assert "options" not in postgres_bounds("manage.py")
    assert postgres_bounds("gunicorn")["options"] == "-c statement_timeout=15000"


def test_the_environment_and_the_url_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("YARD_DB_STATEMENT_TIMEOUT_MS", "5000")
    monkeypatch.setenv("YARD_DB_TCP_USER_TIMEOUT_MS", "3000")
    db = database_from_url("postgres://u@db.example/yard?connect_timeout=2", base_dir=ROOT)
    options = db["OPTIONS"]
    assert isinstance(options, dict)
    assert (options["connect_timeout"], options["tcp_user_timeout"], options["options"]) == (
        "2", 3000, "-c statement_timeout=5000",
    )  # fmt: skip
    assert db["CLIENT_TIMEOUT_S"] == 10.0
    monkeypatch.setenv("YARD_DB_CLIENT_TIMEOUT_S", "0")
    assert database_from_url("postgres://u@db.example/yard", base_dir=ROOT)["CLIENT_TIMEOUT_S"] == 0.0


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("YARD_DB_CONNECT_TIMEOUT_S", "5s", "YARD_DB_CONNECT_TIMEOUT_S='5s' is not an integer"),
        ("YARD_DB_CONNECT_TIMEOUT_S", "0", "must be at least 1"),
        ("YARD_DB_STATEMENT_TIMEOUT_MS", "-1", "must be at least 0"),
        ("YARD_DB_KEEPALIVES_COUNT", "many", "is not an integer"),
        ("YARD_DB_CLIENT_TIMEOUT_S", "soon", "is not a number"),
    ],
)
def test_a_bad_bound_stops_start_up_naming_it(monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ImproperlyConfiguredEnv, match=message):
        database_from_url("postgres://u@db.example/yard", base_dir=ROOT)


def test_python_dash_m_celery_is_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.argv", ["/venv/lib/python3.11/site-packages/celery/__main__.py", "-A", "portal", "worker"])
    options = database_from_url("postgres://u@db.example/yard", base_dir=ROOT)["OPTIONS"]
    assert isinstance(options, dict)
    assert options["options"] == "-c statement_timeout=120000"
    assert str(options["application_name"]).startswith("yardmaster celery ")


@pytest.mark.django_db(transaction=True)
def test_a_budget_ends_every_database_wait_inside_it_together() -> None:
    """portal.pg.base.budget: a statement that outlasts the request's budget fails with an
    OperationalError at the budget (not at the statement timeout), the connection is closed, and the
    next statement outside the budget runs on a new one."""
    import time

    from django.db import OperationalError, connection

    from portal.pg.base import budget

    if connection.vendor != "postgresql":
        pytest.skip("the budget bounds PostgreSQL connections")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # a connection from before the budget
    started = time.monotonic()
    with budget(0.5), pytest.raises(OperationalError, match="budget"), connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.3)")
        cursor.execute("SELECT pg_sleep(0.3)")  # the two together outlast it
    elapsed = time.monotonic() - started
    assert 0.45 <= elapsed < 2.0, elapsed
    connection.close_if_unusable_or_obsolete()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_sleep(0.6), 1")
        assert cursor.fetchone()[1] == 1
