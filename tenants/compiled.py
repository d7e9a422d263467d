"""Querysets of a fixed shape, compiled to SQL once per thread and database connection and run with new values.

Compiling a queryset (its joins, select list, filters and converters) costs a few tenths of a millisecond
of CPU each time, and a REST submission ran several whose shape never changes, only their values (the
token's hash, the user's id, an Idempotency-Key): about a third of its CPU. The heartbeat does the same
for its one query (scheduling/agent/services/heartbeat.py). Rows become model instances exactly as
Django's own iterator makes them (the backend's converters, the select_related populators), and the
tests compare each use with the ORM's own answer (tests/api/test_submission_fast_path.py).

A value is found in the compiled statement's parameters by a sentinel given in its place: every sentinel
must come out of the compiler as itself, once (exact lookups on plain columns), or the compile refuses.
Lives in tenants, the lower layer, so that both tenants and scheduling use it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]

M = TypeVar("M", bound=Model)


class _Compiled:
    __slots__ = ("at", "compiler", "connection", "converters", "names", "params", "populators", "sql")

    def __init__(self, qs: QuerySet[Any], sentinels: Sequence[Any]) -> None:
        compiler = qs.query.get_compiler(using=qs.db)
        sql, params = compiler.as_sql()
        params = list(params)
        at = []
        for sentinel in sentinels:
            found = [i for i, p in enumerate(params) if type(p) is type(sentinel) and p == sentinel]
            if len(found) != 1:
                raise ValueError(f"sentinel {sentinel!r} appears {len(found)} times in the compiled parameters")
            at.append(found[0])
        self.connection = compiler.connection
        self.compiler = compiler
        self.sql = sql
        self.params = params
        self.at = at
        select = compiler.select
        self.converters = compiler.get_converters([s[0] for s in select[0 : compiler.col_count]])
        klass_info = compiler.klass_info
        if qs._fields is None and klass_info is not None:  # type: ignore[attr-defined]  # a model queryset, not values()/values_list()
            fields = klass_info["select_fields"]
            self.names = [f[0].target.attname for f in select[fields[0] : fields[-1] + 1]]
            self.populators = get_related_populators(klass_info, select, compiler.connection.alias)
        else:
            self.names, self.populators = [], []

    def execute(self, values: Sequence[Any]) -> list[Any]:
        params = list(self.params)
        for i, value in zip(self.at, values, strict=True):
            params[i] = value
        with self.connection.cursor() as cursor:
            cursor.execute(self.sql, params)
            rows: list[Any] = cursor.fetchall()
        if self.converters:
            rows = [tuple(r) for r in self.compiler.apply_converters(rows, self.converters)]
        return rows


class CompiledQuery(Generic[M]):
    """``build(*sentinels)``'s queryset, compiled once per thread and connection; ``rows(*values)`` and
    ``objects(*values)`` run it with ``values`` in the sentinels' places.

    ``build`` must give the same shape for any values (no list whose length varies: give one
    CompiledQuery per length). Its ordering and slicing are part of the shape: ``.order_by("pk")[:1]``
    is ``.first()``.
    """

    def __init__(self, build: Callable[..., QuerySet[Any, Any]], *sentinels: Any) -> None:
        self.build = build
        self.sentinels = sentinels
        self.local = threading.local()

    def _compiled(self) -> _Compiled:
        state: _Compiled | None = getattr(self.local, "compiled", None)
        if state is None or state.connection is not connections[DEFAULT_DB_ALIAS]:
            state = _Compiled(self.build(*self.sentinels), self.sentinels)
            self.local.compiled = state
        return state

    def rows(self, *values: Any) -> list[tuple[Any, ...]]:
        """The rows of a values_list() queryset, converted as the ORM converts them."""
        return self._compiled().execute(values)

    def objects(self, *values: Any) -> list[M]:
        """The model instances of the queryset, with its select_related objects in place."""
        state = self._compiled()
        rows = state.execute(values)
        start = state.compiler.klass_info["select_fields"][0]
        end = start + len(state.names)
        model = state.compiler.klass_info["model"]
        alias = state.connection.alias
        out = []
        for row in rows:
            obj = model.from_db(alias, state.names, row[start:end])
            for populator in state.populators:
                populator.populate(row, obj)
            out.append(obj)
        return out
