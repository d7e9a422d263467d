"""The health check at a request's first query (portal.pg.base.DatabaseWrapper.close_if_health_check_failed):
no round trip on an idle connection nothing arrived on; a connection the server closed is still replaced."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from django.db import connection


@pytest.fixture
def other(transactional_db: None) -> Iterator[psycopg.Connection]:
    """A second session on the same database, to watch and to end the portal's."""
    params = connection.get_connection_params()
    with psycopg.connect(
        **{k: v for k, v in params.items() if k in ("dbname", "user", "host", "port", "password")}, autocommit=True
    ) as conn:
        yield conn


def activity(other: psycopg.Connection, pid: int) -> tuple[object, ...] | None:
    return other.execute("SELECT query, query_start FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()


def test_an_idle_connection_is_not_asked_select_1(other: psycopg.Connection) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 41 + 1")
    pid = connection.connection.info.backend_pid
    before = activity(other, pid)
    connection.health_check_done = False  # a new request
    connection.close_if_health_check_failed()
    assert connection.connection is not None and connection.connection.info.backend_pid == pid
    assert activity(other, pid) == before  # no statement reached the server (Django's check sends SELECT 1)


def test_a_connection_the_server_ended_is_replaced_at_the_next_request(other: psycopg.Connection) -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    pid = connection.connection.info.backend_pid
    assert other.execute("SELECT pg_terminate_backend(%s, 5000)", [pid]).fetchone() == (True,)
    connection.health_check_done = False  # a new request
    connection.close_if_health_check_failed()
    assert connection.connection is None  # found dead before any query of the request: closed
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # and the request's first query opens a new one
    assert connection.connection.info.backend_pid != pid
