"""Django's PostgreSQL backend, with a client-side deadline on every round trip to the server.

libpq's own bounds (connect_timeout, keepalives, tcp_user_timeout, statement_timeout: portal/env.py)
all need the server, or the network, to do something: answer, drop, or stop acknowledging. A server
that acknowledges every packet and never answers (hung, stopped, or behind a proxy that forwards
nothing) trips none of them, and psycopg waits for its answer for ever, holding a gunicorn thread. Here
psycopg's own wait gets a timeout (the entry's CLIENT_TIMEOUT_S, by default the statement timeout plus
5 s): past it the connection is closed, as its protocol state is unknown, and the caller gets an
OperationalError, which the web tier answers with a 503 (portal/middleware.py); Django then drops the
connection and the next request opens a new one.
"""

from __future__ import annotations

import inspect
import math
import select
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import psycopg
from django.db.backends.postgresql import base
from psycopg import pq

_WAIT_HAS_TIMEOUT = "timeout" in inspect.signature(psycopg.Connection.wait).parameters  # psycopg >= 3.2.x
_BUDGET_UNTIL: ContextVar[float | None] = ContextVar("yard_db_budget_until", default=None)


@contextmanager
def budget(seconds: float) -> Iterator[None]:
    """Inside, all the database waits together end ``seconds`` from now (monotonic), each also within its
    own CLIENT_TIMEOUT_S; past it the caller gets an OperationalError (a 503 "unavailable" on the web
    tier). For a caller that must answer within its client's timeout however slow the database is: a
    heartbeat that cannot be recorded in time is better answered "unavailable" (the portal counts that
    time as blind, the agent pauses its silence clock) than left to time out at the agent, which then
    counts it as silence and stops its work."""
    token = _BUDGET_UNTIL.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _BUDGET_UNTIL.reset(token)


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait on the server ends after `yard_deadline_s` (0: never)."""

    yard_deadline_s: float = 0.0

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        deadline, why = self.yard_deadline_s, "CLIENT_TIMEOUT_S"
        until = _BUDGET_UNTIL.get()
        if until is not None:
            left = max(until - time.monotonic(), 0.001)
            if not deadline or left < deadline:
                deadline, why = left, "the request's database budget"
        if not deadline or not _WAIT_HAS_TIMEOUT or kwargs.get("timeout") is not None:
            return super().wait(gen, *args, **kwargs)
        try:
            return super().wait(gen, *args, **{**kwargs, "timeout": deadline})
        except psycopg.errors.OperationalError as exc:
            if type(exc).__name__ != "_WaitTimeout":
                raise
            # Half-way through a protocol exchange: nothing more can be said on this connection.
            self.pgconn.finish()
            raise psycopg.OperationalError(
                f"PostgreSQL did not answer within {deadline:g} s ({why}); the connection was closed"
            ) from None


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        until = _BUDGET_UNTIL.get()
        if until is not None:
            # Inside a budget a new connection may take what is left of it too (libpq counts whole
            # seconds, and at least 2).
            left = max(2, math.ceil(until - time.monotonic()))
            configured = int(conn_params.get("connect_timeout") or 0)
            conn_params = {**conn_params, "connect_timeout": min(configured, left) if configured else left}
        connection = super().get_new_connection(conn_params)
        if type(connection) is psycopg.Connection:
            # Bounded also without a CLIENT_TIMEOUT_S: a request's budget (above) may still apply.
            connection.__class__ = BoundedConnection
            connection.yard_deadline_s = float(self.settings_dict.get("CLIENT_TIMEOUT_S") or 0)  # type: ignore[attr-defined]
        return connection

    def close_if_health_check_failed(self) -> None:
        """The health check at a request's first query (CONN_HEALTH_CHECKS), without its round trip when the
        connection shows it is alive: idle, and nothing arrived on its socket while it was.

        On an idle connection the server sends nothing unasked; what it sends before it closes one (a
        restart, pg_terminate_backend, idle_session_timeout: an error, then EOF) or the kernel's verdict on a
        dead peer (keepalives, tcp_user_timeout) makes the socket readable, and then the server is asked
        (SELECT 1, Django's check) as before. What this does not see is a peer gone without a word (a half-
        open connection): SELECT 1 would wait on it until the client timeout or the request's budget ran
        out, and now the request's own first statement does, and fails with the same OperationalError (a
        503 on the web tier); Django then drops the connection. The round trip was 5 % of a heartbeat's CPU.
        """
        # (django-stubs know neither attribute; BaseDatabaseWrapper sets both)
        due = self.health_check_enabled and not self.health_check_done  # type: ignore[attr-defined,has-type]
        if self.connection is not None and due and self._quiet_socket():
            self.health_check_done = True
            return
        super().close_if_health_check_failed()

    def _quiet_socket(self) -> bool:
        pgconn = self.connection.pgconn
        try:
            if pgconn.status != pq.ConnStatus.OK or pgconn.transaction_status != pq.TransactionStatus.IDLE:
                return False
            poll = select.poll()  # not select(): a worker with many connections has descriptors past 1024
            poll.register(pgconn.socket, select.POLLIN)
            events = poll.poll(0)  # POLLIN, or POLLHUP / POLLERR, which are always reported
        except (OSError, ValueError, psycopg.Error):
            return False
        return not events
