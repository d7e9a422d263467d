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
from typing import Any

import psycopg
from django.db.backends.postgresql import base

_WAIT_HAS_TIMEOUT = "timeout" in inspect.signature(psycopg.Connection.wait).parameters  # psycopg >= 3.2.x


class BoundedConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait on the server ends after `yard_deadline_s` (0: never)."""

    yard_deadline_s: float = 0.0

    def wait(self, gen: Any, *args: Any, **kwargs: Any) -> Any:
        if not self.yard_deadline_s or not _WAIT_HAS_TIMEOUT or kwargs.get("timeout") is not None:
            return super().wait(gen, *args, **kwargs)
        deadline = self.yard_deadline_s
        try:
            return super().wait(gen, *args, **{**kwargs, "timeout": deadline})
        except psycopg.errors.OperationalError as exc:
            if type(exc).__name__ != "_WaitTimeout":
                raise
            # Half-way through a protocol exchange: nothing more can be said on this connection.
            self.pgconn.finish()
            raise psycopg.OperationalError(
                f"PostgreSQL did not answer within {deadline:g} s (CLIENT_TIMEOUT_S); the connection was closed"
            ) from None


class DatabaseWrapper(base.DatabaseWrapper):
    def get_new_connection(self, conn_params: dict[str, Any]) -> Any:
        connection = super().get_new_connection(conn_params)
        deadline = float(self.settings_dict.get("CLIENT_TIMEOUT_S") or 0)
        if deadline and type(connection) is psycopg.Connection:
            connection.__class__ = BoundedConnection
            connection.yard_deadline_s = deadline  # type: ignore[attr-defined]
        return connection
