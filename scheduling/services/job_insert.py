"""A submission's rows in one statement (PostgreSQL): the job, its submit event and its audit entry.

scheduling/services/submit.py `_insert_job` fills it in; this module builds it. The job's NULL columns
are written into the statement as NULL literals, not bound: a new job leaves most of its 48 columns
NULL (started_at, exit_code, the idle and stop stamps, its array ...), and with them bound the
statement carried 62 parameters, more than psycopg's MAX_CACHED_STATEMENT_PARAMS (50), so psycopg
split and parsed the whole statement again at every submission (a tenth of a millisecond of a web
worker's CPU each). With them literal it carries about 46, and psycopg parses it once per process and
NULL-mask. The text sent to the server is the same either way: psycopg's client-side binding writes a
None as NULL (tests/api/test_submission_fast_path.py compares them byte for byte).
"""

from __future__ import annotations

from typing import Any

from django.db import connection

from scheduling.models import Job, JobEvent
from tenants.models import AuditEntry

# The job's columns bound from Python, in order: all but its id and checkpoint directory, which the
# statement makes from the sequence (the directory is named by the id).
BOUND = [f for f in Job._meta.concrete_fields if f.attname not in ("id", "checkpoint_dir")]
# One statement per pattern of NULL columns: in practice a handful (a plain job, one with a key, a
# copy, a service's replica); bounded all the same, should a caller vary them widely.
_BY_NULLS: dict[tuple[bool, ...], str] = {}
_MAX_KINDS = 64


def job_values(job: Job) -> list[Any]:
    """The job's BOUND columns as the database takes them (None: NULL)."""
    return [f.get_db_prep_save(f.pre_save(job, True), connection) for f in BOUND]


def insert_sql(nulls: tuple[bool, ...]) -> str:
    """The statement for a job whose BOUND columns are NULL where ``nulls`` says so (those are literals);
    its parameters: the job table's name, the job's other BOUND values in order, the checkpoint directory
    asked for (or None) and the team's directory, then the event's five and the audit entry's six."""
    sql = _BY_NULLS.get(nulls)
    if sql is not None:
        return sql
    q = connection.ops.quote_name

    def col(model: Any, name: str) -> str:
        return q(model._meta.get_field(name).column)

    job_table, event_table, audit_table = (q(m._meta.db_table) for m in (Job, JobEvent, AuditEntry))
    columns = ", ".join(q(f.column) for f in BOUND)
    values = ", ".join(f"{'NULL' if null else '%s'}::{f.db_type(connection)}" for f, null in zip(BOUND, nulls, strict=True))
    event_cols = ", ".join(
        col(JobEvent, n) for n in ("job", "time", "attempt", "from_state", "to_state", "reason", "actor", "actor_label")
    )
    audit_cols = ", ".join(
        col(AuditEntry, n)
        for n in ("time", "actor", "actor_label", "action", "object_type", "object_id", "unit", "message", "data")
    )
    sql = (
        f"WITH new AS (SELECT nextval(pg_get_serial_sequence(%s, 'id')) AS id), "
        f"j AS (INSERT INTO {job_table} ({columns}, {col(Job, 'id')}, {col(Job, 'checkpoint_dir')}) "
        f"SELECT {values}, new.id, COALESCE(%s, %s || '/' || new.id::text) FROM new "
        # The Idempotency-Key's unique constraint: a concurrent request's job with it wins, and this
        # statement writes nothing (no savepoint needed to survive the violation).
        f"ON CONFLICT DO NOTHING RETURNING {col(Job, 'id')} AS id, {col(Job, 'checkpoint_dir')} AS dir), "
        f"e AS (INSERT INTO {event_table} ({event_cols}) "
        f"SELECT j.id, %s, 1, '', %s, %s, %s, %s FROM j RETURNING {col(JobEvent, 'id')} AS id), "
        f"a AS (INSERT INTO {audit_table} ({audit_cols}) "
        f"SELECT %s, %s, %s, 'job.submit', 'job', j.id::text, %s, %s, %s::jsonb FROM j) "
        "SELECT j.id, j.dir, e.id FROM j, e"
    )
    if len(_BY_NULLS) >= _MAX_KINDS:
        _BY_NULLS.clear()
    _BY_NULLS[nulls] = sql
    return sql
