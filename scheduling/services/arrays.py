"""Job arrays (Slurm's ``--array``): one submission of N tasks, each a job of its own, and cancelling them.

A task is an ordinary job (its own state, attempts, logs, exit code, preemption and accounting) with its
array and index; its variables say which index it is (YARD_ARRAY_TASK_ID and its kin, the sbatch
translation's SLURM_ARRAY_*). The submission is checked once for the whole array (fields, permission,
the admission verdict: every task has the same shape) and written in bulk, in a fixed number of
statements whatever its size: ids reserved from the sequence, one INSERT ... SELECT for the tasks and one
for their events, one audit entry for the array.
"""

from __future__ import annotations

import copy
import posixpath
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, cast

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.db.models import Field, Model
from django.utils import timezone

from scheduling.arrayspec import ArraySpec, ArraySpecError, parse_array
from scheduling.models import Job, JobArray, JobEvent, JobKind
from scheduling.selectors import array_limit_reason, array_tasks_held, yard_number
from scheduling.services.common import IdempotencyConflict, cycle_request
from scheduling.services.lifecycle import job_cancel
from scheduling.services.submit import JobSpec, _same_spec, _team_dir, job_admit, job_row, with_default_resources
from scheduling.states import ACTIVE_STATES, JobState
from tenants.services import audit

ARRAY_ENV_PREFIX = "YARD_ARRAY_"
INSERT_BATCH = 500


def max_array_size() -> int:
    return int(yard_number("MAX_ARRAY_SIZE"))


def array_spec_parse(text: str) -> ArraySpec:
    """--array's text, or a ValidationError on ``array`` saying what to change."""
    try:
        return parse_array(text, max_size=max_array_size())
    except ArraySpecError as exc:
        raise ValidationError({"array": [str(exc)]}) from None


@dataclass(frozen=True)
class ArraySubmitted:
    array: JobArray
    created: bool  # False: the Idempotency-Key's earlier array, returned as it is
    verdict: str  # the admission verdict every task was given


def job_array_submit(
    *, user: User, spec: JobSpec, array: str, idempotency_key: str | None = None, copied_from: Job | None = None
) -> ArraySubmitted:
    """Validate once, run the admission check once, create every task PENDING in bulk; the same key and spec
    twice -> the same array.

    Raises ValidationError (``array`` for the indices; the rest as job_submit) and IdempotencyConflict when
    the key was used for another spec or for a single job.
    """
    parsed = array_spec_parse(array)
    if spec.kind != JobKind.BATCH:
        raise ValidationError({"array": ["Only batch jobs come in arrays"]})
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 128):
        raise ValidationError({"idempotency_key": "Between 1 and 128 characters"})
    if reserved := sorted(k for k in spec.env if str(k).startswith(ARRAY_ENV_PREFIX)):
        raise ValidationError({"env": [f"{', '.join(reserved)}: the array sets {ARRAY_ENV_PREFIX}* itself; use another name"]})
    spec = with_default_resources(spec)
    if idempotency_key and (existing := _existing_array(user, idempotency_key, spec, parsed)) is not None:
        return existing
    spec, verdict, now = job_admit(user=user, spec=spec)
    try:
        with transaction.atomic():
            made = _create_array(
                user=user, spec=spec, parsed=parsed, key=idempotency_key, now=now, reason=verdict.reason, copied_from=copied_from
            )
    except IntegrityError:
        # A concurrent retry with the same key won the race: answer with its array.
        if idempotency_key and (existing := _existing_array(user, idempotency_key, spec, parsed)) is not None:
            return existing
        raise
    cycle_request()
    return ArraySubmitted(array=made, created=True, verdict=verdict.reason)


def _task_checkpoint_dir(spec: JobSpec, index: int, pk: int) -> str:
    """A task's own checkpoint directory: DIR/INDEX under a given one (tasks must not share one), else the
    team's directory and its job id, as a single job's."""
    if spec.checkpoint_dir:
        return posixpath.join(posixpath.normpath(spec.checkpoint_dir), str(index))
    return str(_team_dir(spec.team) / str(pk))


def _existing_array(user: User, key: str, spec: JobSpec, parsed: ArraySpec) -> ArraySubmitted | None:
    head = Job.objects.filter(user=user, idempotency_key=key).select_related("array").first()
    if head is None:
        return None
    if head.array is None or head.array_id != head.pk or head.array.text != parsed.text:
        raise IdempotencyConflict(head)
    index = parsed.indices[0]
    as_head = replace(
        spec,
        env={**spec.env, **parsed.env(array_id=head.pk, index=index)},
        checkpoint_dir=_task_checkpoint_dir(spec, index, head.pk) if spec.checkpoint_dir else "",
    )
    task = copy.copy(head)
    task.array_id = None  # compared as the single job it is shaped like: _same_spec refuses array tasks
    if not _same_spec(task, as_head):
        raise IdempotencyConflict(head)
    return ArraySubmitted(array=head.array, created=False, verdict=head.pending_reason or f"already submitted ({head.state})")


def _reserve_ids(count: int) -> list[int] | None:
    """``count`` new job ids from PostgreSQL's sequence, so every task is written whole in one INSERT (its
    array id and checkpoint directory need them); None elsewhere (SQLite: the ids come back from the INSERT)."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", [Job._meta.db_table, count]
        )
        return sorted(row[0] for row in cursor.fetchall())


def _create_array(
    *, user: User, spec: JobSpec, parsed: ArraySpec, key: str | None, now: datetime, reason: str, copied_from: Job | None
) -> JobArray:
    ids = _reserve_ids(parsed.count)
    head_id = ids[0] if ids else None
    template = job_row(user=user, spec=spec, now=now, pending_reason=reason, array_id=head_id, copied_from=copied_from)
    if ids is not None and head_id is not None:
        made = _new_array(head_id, parsed, now)
        _insert_tasks(template, parsed=parsed, ids=ids, key=key, spec=spec)
    else:
        made = _create_returning_ids(template, parsed=parsed, key=key, spec=spec, now=now)
    _insert_submit_events(made, user=user, now=now)
    audit(
        actor=user,
        action="job.submit_array",
        obj=Job(pk=made.pk),
        unit=spec.team,
        message=f"{spec.name}: array {made.text} of {made.task_count} tasks, each {spec.replicas}x{spec.gpus_per_replica} "
        f"{spec.gpu_type}, tier {spec.tier}",
        data={"array": made.pk, "tasks": made.task_count, "idempotency_key": key},
    )
    return made


def _new_array(head_id: int, parsed: ArraySpec, now: datetime) -> JobArray:
    return JobArray.objects.create(
        id=head_id,
        indices=parsed.text.partition("%")[0],
        task_count=parsed.count,
        max_running=parsed.max_running,
        submitted_at=now,
    )


# What differs from task to task; every other column is the template job's (job_row: one place for them).
_PER_TASK = ("id", "array_index", "env", "checkpoint_dir", "pending_reason", "idempotency_key")


def _insert_tasks(template: Job, *, parsed: ArraySpec, ids: list[int], key: str | None, spec: JobSpec) -> None:
    """Every task in one INSERT ... SELECT over the ids and indices (PostgreSQL): the shared columns are the
    template's, bound once; the index, its variable, its checkpoint directory and its pending reason are
    made per row by the database. The ORM's bulk_create builds and binds some 50 columns per row in Python:
    seconds for 4,000 tasks, where the whole request has 2 s (bench/array_submit.py)."""
    shared = [f for f in Job._meta.concrete_fields if f.attname not in _PER_TASK]
    columns = ", ".join(connection.ops.quote_name(f.column) for f in shared)
    values = ", ".join(f"%s::{f.db_type(connection)}" for f in shared)
    params: list[Any] = [f.get_db_prep_save(getattr(template, f.attname), connection) for f in shared]
    env_field = Job._meta.get_field("env")
    env = {**template.env, **parsed.env(array_id=ids[0], index=parsed.indices[0])}
    limit = parsed.max_running
    held = array_limit_reason(array_id=ids[0], max_running=limit) if limit is not None else template.pending_reason
    if spec.checkpoint_dir:  # DIR/INDEX, as _task_checkpoint_dir
        checkpoint_sql, checkpoint_base = "%s || '/' || t.idx::text", posixpath.normpath(spec.checkpoint_dir)
    else:
        checkpoint_sql, checkpoint_base = "%s || '/' || t.id::text", str(_team_dir(spec.team))
    table = connection.ops.quote_name(Job._meta.db_table)
    per_task = ", ".join(_column(Job, name) for name in _PER_TASK)
    sql = (
        f"INSERT INTO {table} ({columns}, {per_task}) "
        f"SELECT {values}, t.id, t.idx, %s::jsonb || jsonb_build_object('YARD_ARRAY_TASK_ID', t.idx::text), "
        f"{checkpoint_sql}, CASE WHEN t.n > %s THEN %s ELSE %s END, CASE WHEN t.n = 1 THEN %s END "
        "FROM unnest(%s::bigint[], %s::bigint[]) WITH ORDINALITY AS t(id, idx, n)"
    )
    params += [
        env_field.get_db_prep_save(env, connection),
        checkpoint_base,
        limit if limit is not None else len(ids),
        held,
        template.pending_reason,
        key,
        ids,
        list(parsed.indices),
    ]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _insert_submit_events(array: JobArray, *, user: User, now: datetime) -> None:
    """Each task's submit event, as job_submit writes a job's, made from the tasks' own rows by the database."""
    q = connection.ops.quote_name
    names = ("job", "time", "attempt", "from_state", "to_state", "reason", "actor", "actor_label")
    columns = ", ".join(_column(JobEvent, n) for n in names)
    sql = (
        f"INSERT INTO {q(JobEvent._meta.db_table)} ({columns}) "
        f"SELECT {_column(Job, 'id')}, %s, 1, '', %s, %s || {_column(Job, 'pending_reason')}, %s, %s "
        f"FROM {q(Job._meta.db_table)} WHERE {_column(Job, 'array')} = %s"
    )
    params: list[Any] = [now, JobState.PENDING, "submitted; ", user.pk, user.get_username(), array.pk]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _column(model: type[Model], name: str) -> str:
    return connection.ops.quote_name(cast("Field[Any, Any]", model._meta.get_field(name)).column)


def _create_returning_ids(template: Job, *, parsed: ArraySpec, key: str | None, spec: JobSpec, now: datetime) -> JobArray:
    """Where no sequence hands out ids first (SQLite, the demo): the ORM inserts the tasks, then what needed
    their ids (the array's id, the variables, the checkpoint directories) is written."""
    limit = parsed.max_running
    rows = []
    for n, index in enumerate(parsed.indices):
        row = copy.copy(template)
        row.array_id, row.array_index, row.idempotency_key = None, index, key if n == 0 else None
        rows.append(row)
    Job.objects.bulk_create(rows, batch_size=INSERT_BATCH)
    head_id = rows[0].pk
    made = _new_array(head_id, parsed, now)
    held = array_limit_reason(array_id=head_id, max_running=limit) if limit is not None else ""
    for n, row in enumerate(rows):
        row.array_id = head_id
        row.env = {**template.env, **parsed.env(array_id=head_id, index=row.array_index or 0)}
        row.checkpoint_dir = _task_checkpoint_dir(spec, row.array_index or 0, row.pk)
        if limit is not None and n >= limit:
            row.pending_reason = held
    Job.objects.bulk_update(rows, ["array", "env", "checkpoint_dir", "pending_reason"], batch_size=INSERT_BATCH)
    return made


@transaction.atomic
def job_array_cancel(*, array: JobArray, actor: User) -> int:
    """Cancel every task of the array, as scancel of its id does: the pending ones at once, in bulk; the
    running ones are told to stop (each ends CANCELLED). Returns how many tasks it cancelled or stopped."""
    pending = list(Job.objects.select_for_update().filter(array=array, state=JobState.PENDING).values_list("pk", "attempt"))
    now = timezone.now()
    label = actor.get_username()
    if pending:
        ids = [pk for pk, _ in pending]
        Job.objects.filter(pk__in=ids, state=JobState.PENDING).update(
            state=JobState.CANCELLED,
            state_changed_at=now,
            ended_at=now,
            pending_reason="",
            estimated_start=None,
            reservation_domain="",
        )
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job_id=pk,
                    time=now,
                    attempt=attempt,
                    from_state=JobState.PENDING,
                    to_state=JobState.CANCELLED,
                    reason=f"cancelled by {label} (the whole array {array.pk})",
                    actor=actor,
                    actor_label=label,
                )
                for pk, attempt in pending
            ],
            batch_size=INSERT_BATCH,
        )
    running = list(Job.objects.filter(array=array, state__in=ACTIVE_STATES, stop_requested_at__isnull=True))
    for job in running:
        job_cancel(job=job, actor=actor)
    head = Job.objects.select_related("team").get(pk=array.pk)
    audit(
        actor=actor,
        action="job.cancel_array",
        obj=head,
        unit=head.team,
        message=f"cancel array {array.pk} ({len(pending)} pending, {len(running)} running)",
        data={"array": array.pk, "pending": len(pending), "running": len(running)},
    )
    cycle_request()
    return len(pending) + len(running)


def job_arrays_hold_reasons() -> int:
    """Write "JobArrayTaskLimit" as the pending reason of every task its array's limit holds back (the cycle
    leaves them out of the core's snapshot, so the plan has no word for them): one UPDATE per array whose
    held tasks say something else. Returns the rows changed."""
    changed = 0
    for array_id, (limit, ids) in array_tasks_held().items():
        reason = array_limit_reason(array_id=array_id, max_running=limit)
        changed += (
            Job.objects.filter(pk__in=ids, state=JobState.PENDING)
            .exclude(pending_reason=reason)
            .update(pending_reason=reason, estimated_start=None, reservation_domain="")
        )
    return changed


@transaction.atomic
def job_array_throttle(*, array: JobArray, max_running: int | None, actor: User) -> JobArray:
    """Change the most tasks of the array running at once (Slurm's scontrol update ArrayTaskThrottle): the
    next cycle places up to the new limit, or, lowered, starts none until fewer run (none is stopped)."""
    if max_running is not None and max_running < 1:
        raise ValidationError({"max_running": ["At least 1, or null for no limit"]})
    before = array.max_running
    JobArray.objects.filter(pk=array.pk).update(max_running=max_running)
    array.max_running = max_running
    head = Job.objects.select_related("team").get(pk=array.pk)
    audit(
        actor=actor,
        action="job.throttle_array",
        obj=head,
        unit=head.team,
        message=f"array {array.pk}: at most {max_running or 'any number of'} tasks at once (was {before or 'no limit'})",
        data={"array": array.pk, "before": before, "after": max_running},
    )
    cycle_request()
    return array
