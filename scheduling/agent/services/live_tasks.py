"""A node's live tasks, with their jobs and owners, as the heartbeat reads them: one statement, compiled
once per thread, its rows made into model instances without ``Model.__init__``.

This is the one read of a steady heartbeat, the call every node makes every few seconds, so it is
built for that: the query's SQL, its converters and related populators are made once per thread and
connection (compiling it was half of a beat's CPU), and its rows become instances the way
``Model.from_db`` would leave them, but without going through ``Model.__init__`` field by field (25
instances a beat on a node with 8 tasks were a fifth of its CPU; ``fast_from_db``).
tests/agent_api/test_heartbeat.py checks the tasks, jobs, owners and services equal the ORM's, attribute
for attribute.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Model, QuerySet
from django.db.models.base import ModelState
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]
from django.db.models.signals import post_init, pre_init

from scheduling.models import Allocation, Node, Task
from scheduling.states import TASK_LIVE_STATES

# What a heartbeat reads of a task, its job and the job's owner: nothing it does not send or decide on.
_TASK_FIELDS = (
    "id", "job_id", "attempt", "rank", "node_id", "state", "master_addr", "master_port", "gpu_indices", "started_at",
    "checkpoint_at", "notebook_url", "notebook_kernel_busy", "notebook_last_activity",
    "cpu_used", "memory_used_mb", "memory_peak_mb",
    "job__id", "job__name", "job__kind", "job__replicas", "job__cpus_per_replica", "job__memory_mb_per_replica", "job__command",
    "job__env", "job__checkpoint_dir", "job__time_limit_s",
    "job__stop_requested_at", "job__stop_reason", "job__stop_grace_s", "job__last_checkpoint_at", "job__attempt",
    "job__state", "job__user_id", "job__user__id", "job__user__username",
    "job__team_id", "job__image", "job__container_mounts", "job__container_workdir",
    "service_url", "service_ready", "service_restarts", "service_last_restart_at", "service_crash_looping", "service_message",
    "dev_endpoint", "dev_login", "dev_host_key", "dev_connections", "dev_last_activity",
    "job__service_id", "job__service_revision", "job__service__id", "job__service__port", "job__service__readiness_path",
    "job__service__liveness_path", "job__service__probe_period_s", "job__service__probe_timeout_s",
    "job__service__failure_threshold", "job__service__success_threshold", "job__service__initial_delay_s",
)  # fmt: skip


def live_tasks_of(*, node: Node) -> list[Task]:
    """The node's live tasks with their jobs and owners, in one query: each task carries its GPU indices
    (Task.gpu_indices, written at placement). Tasks made before that field existed get theirs from
    their live allocations, in one more query."""
    tasks = _LIVE_TASKS.fetch(node.pk)
    missing = [t for t in tasks if not t.gpu_indices]
    if missing:
        by_task: dict[int, list[int]] = {}
        live = Allocation.objects.filter(task__in=missing, released_at__isnull=True).order_by("gpu__index")
        for task_id, index in live.values_list("task_id", "gpu__index"):
            by_task.setdefault(task_id, []).append(index)
        for task in missing:
            task.gpu_indices = by_task.get(task.pk, [])
    return tasks


def live_tasks_queryset(node_id: int) -> QuerySet[Task]:
    return (
        Task.objects.filter(node_id=node_id, state__in=TASK_LIVE_STATES)
        .select_related("job__user", "job__service")
        .only(*_TASK_FIELDS)
        .order_by("job_id", "rank")
    )


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
    """Stands for a model class in Django's related populators: ``from_db`` by ``fast_from_db``."""

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


class _CompiledOnce:
    """live_tasks_queryset, compiled to SQL once per thread and run with each node's id.

    Compiling the query (joins, the select list, the state filter) was half the CPU of a heartbeat,
    the path every node calls every few seconds; its shape never changes, only the node id does. The
    rows become model instances as Django's own iterator makes them (the same converters and related
    populators, the instances built by ``fast_from_db``), and tests/agent_api/test_heartbeat.py checks
    the result equals the ORM's.
    """

    SENTINEL = -7_340_033  # a node id no database has, to find the parameter to substitute

    def __init__(self) -> None:
        self.local = threading.local()

    def _compiled(self) -> tuple[Any, str, list[Any], int, list[str], list[Any], dict[int, Any], _Fast]:
        """The statement and all that turns its rows into tasks (names, related populators, the backend's
        converters), made once per thread and connection: per heartbeat they were a fifth of its CPU."""
        state = getattr(self.local, "compiled", None)
        if state is None or state[0].connection is not connections[DEFAULT_DB_ALIAS]:
            qs = live_tasks_queryset(self.SENTINEL)
            compiler = qs.query.get_compiler(using=qs.db)
            sql, params = compiler.as_sql()
            select, klass_info = compiler.select, compiler.klass_info
            fields = klass_info["select_fields"]
            names = [f[0].target.attname for f in select[fields[0] : fields[-1] + 1]]
            populators = _fast_populators(get_related_populators(klass_info, select, compiler.connection.alias))
            converters = compiler.get_converters([s[0] for s in select[0 : compiler.col_count]])
            at = list(params).index(self.SENTINEL)
            state = (compiler, sql, list(params), at, names, populators, converters, _Fast(Task))
            self.local.compiled = state
        return state

    def fetch(self, node_id: int) -> list[Task]:
        compiler, sql, params, at, names, populators, converters, task_cls = self._compiled()
        params = [*params[:at], node_id, *params[at + 1 :]]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        start = compiler.klass_info["select_fields"][0]
        end = start + len(names)
        tasks: list[Task] = []
        alias = connection.alias
        for row in compiler.apply_converters(rows, converters) if converters else map(list, rows):
            task = task_cls.from_db(alias, names, row[start:end])
            for populator in populators:
                populator.populate(row, task)
            tasks.append(task)  # type: ignore[arg-type]
        return tasks


_LIVE_TASKS = _CompiledOnce()
