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

Rows become instances as ``Model.from_db`` leaves them, but without ``Model.__init__`` (``fast_from_db``):
the heartbeat's 25 instances a beat through ``__init__`` were a fifth of its CPU.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]
from django.db.models.signals import post_init, pre_init

M = TypeVar("M", bound=Model)


def fast_from_db(model: type[Model], db: str, names: Sequence[str], values: Sequence[Any]) -> Model:
    """What ``model.from_db(db, names, values)`` gives, built without ``Model.__init__``.

    ``from_db`` pads the row with a DEFERRED marker per field not loaded, and ``__init__`` then walks
    every concrete field, skipping those and setting the rest one ``setattr`` at a time. A loaded field
    is exactly its attname in the instance's ``__dict__`` (a deferred one is its absence: that is how
    Django tells them apart), so the row goes there in one update. Only for models without
    ``pre_init``/``post_init`` receivers (``_Fast`` falls back to ``from_db`` for the others), whose
    fresh instance has nothing cached that a foreign key's setter would have to clear.
    """
    obj = model.__new__(model)
    obj.__dict__.update(zip(names, values, strict=True))
    state = obj._state = ModelState()
    state.adding = False
    state.db = db
    return obj


class _Fast:
    """Stands for a model class where Django's related populators build instances: ``fast_from_db``."""

    def __init__(self, model: type[Model]) -> None:
        self.model = model
        self._meta = model._meta  # the populators read the class's options
        self.plain = not (pre_init.has_listeners(model) or post_init.has_listeners(model))

    def from_db(self, db: str, names: Sequence[str], values: Sequence[Any]) -> Model:
        if self.plain:
            return fast_from_db(self.model, db, names, values)
        return self.model.from_db(db, names, values)


def _fast_populators(populators: list[Any]) -> list[Any]:
    for populator in populators:
        if not isinstance(populator.model_cls, _Fast):
            populator.model_cls = _Fast(populator.model_cls)
        _fast_populators(populator.related_populators)
    return populators


class _Compiled:
    __slots__ = ("at", "compiler", "connection", "converters", "model", "names", "params", "populators", "sql")

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
            self.populators = _fast_populators(get_related_populators(klass_info, select, compiler.connection.alias))
            self.model: _Fast | None = _Fast(klass_info["model"])
        else:
            self.names, self.populators, self.model = [], [], None

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
        model = state.model
        assert model is not None, "objects() of a values() queryset: use rows()"
        alias = state.connection.alias
        out: list[Any] = []
        for row in rows:
            obj = model.from_db(alias, state.names, row[start:end])
            for populator in state.populators:
                populator.populate(row, obj)
            out.append(obj)
        return out
