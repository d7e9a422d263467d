"""What makes a submission cheap keeps its answers: the admission verdicts remembered per cluster shape
and the job serializers' fields built once per class; the one-statement write and the compiled reads."""

import threading

import pytest
from rest_framework import serializers
from rest_framework.test import APIRequestFactory

from scheduling.api import serializers as s
from scheduling.api.fields_once import FieldsBuiltOnce
from scheduling.cycle import run_cycle_once
from scheduling.models import Job, JobEvent, Node
from tenants.services import quota_set
from tests.api.conftest import job_body, token_client

pytestmark = pytest.mark.django_db


def test_a_limit_lowered_after_a_job_was_taken_refuses_the_same_job_next(cast, nodes):
    client = token_client(cast.ci_token)
    body = job_body(cast.org.team_a, replicas=4, gpus_per_replica=8)
    assert client.post("/api/v1/jobs", body, format="json").status_code == 201
    quota_set(actor=None, unit=cast.org.team_a, gpu_type="H100", guaranteed=16, limit=16)
    refused = client.post("/api/v1/jobs", body, format="json")
    assert refused.status_code == 400
    assert "limit of 16" in refused.json()["message"]


def test_a_cluster_that_shrank_refuses_a_job_it_took_before(cast, nodes):
    client = token_client(cast.ci_token)
    body = job_body(cast.org.team_a, replicas=2, gpus_per_replica=8)
    assert client.post("/api/v1/jobs", body, format="json").status_code == 201
    Node.objects.exclude(pk=nodes[0].pk).delete()
    refused = client.post("/api/v1/jobs", body, format="json")
    assert refused.status_code == 400
    assert "the whole cluster has 8" in refused.json()["message"]


def _as_drf_builds_it(job, context, monkeypatch) -> dict:
    """JobSubmitOut's answer with every serializer's fields built and bound as DRF does, at every instance
    (no FieldsBuiltOnce: its fields built once, its plain fields bound once), nested ones included."""
    with monkeypatch.context() as m:
        m.setattr(FieldsBuiltOnce, "get_fields", lambda self: super(FieldsBuiltOnce, self).get_fields())
        m.setattr(FieldsBuiltOnce, "to_representation", serializers.Serializer.to_representation)
        return s.JobSubmitOut(job, context=context).data


def _placed_job(cast) -> Job:
    response = token_client(cast.ci_token).post("/api/v1/jobs", job_body(cast.org.team_a), format="json")
    run_cycle_once()
    return Job.objects.prefetch_related("tasks__allocations__gpu", "tasks__node__leaf", "events").get(pk=response.json()["id"])


def test_a_job_answer_is_the_one_drf_would_build(cast, nodes, monkeypatch):
    job = _placed_job(cast)
    request = APIRequestFactory().get("/")
    context = {"viewer": cast.ann, "request": request, "translated_from": "slurm", "warnings": ["--mail-user: ignored"]}
    assert job.tasks.count() == 2
    fast, drf = s.JobSubmitOut(job, context=context).data, _as_drf_builds_it(job, context, monkeypatch)
    assert (fast, list(fast)) == (drf, list(drf))
    assert len(fast["tasks"]) == 2 and fast["translated_from"] == "slurm"


def test_an_ended_job_with_every_kind_of_value_answers_as_drf_would(cast, nodes, monkeypatch):
    from django.utils import timezone

    job = _placed_job(cast)
    now = timezone.now()
    Job.objects.filter(pk=job.pk).update(
        state="FAILED", exit_code=3, started_at=now, ended_at=now, estimated_start=now, env={"A": "1", "B": ""},
        image="docker.io/library/python:3.12", container_mounts=[{"source": "/d", "target": "/d", "readonly": True}],
        container_workdir="/w", priority=-5, borrowed=True, locality="leaf", stop_reason="user", leaves_spanned=2,
    )  # fmt: skip
    job = Job.objects.prefetch_related("tasks__allocations__gpu", "tasks__node__leaf", "events").get(pk=job.pk)
    context = {"viewer": cast.ann, "request": None, "translated_from": None, "warnings": []}
    fast, drf = s.JobSubmitOut(job, context=context).data, _as_drf_builds_it(job, context, monkeypatch)
    assert (fast, list(fast)) == (drf, list(drf))
    assert (fast["exit_code"], fast["env"], fast["borrowed"], fast["ended_at"][-1]) == (3, {"A": "1", "B": ""}, True, "Z")
    many = s.JobOut([job, job], many=True).data
    assert [dict(x) for x in many] == [{k: fast[k] for k in s.JobOut.Meta.fields}] * 2


def test_two_answers_made_at_once_keep_their_own_job_and_context(cast, nodes):
    job = _placed_job(cast)
    made = token_client(cast.ci_token).post("/api/v1/jobs", job_body(cast.org.team_a), format="json")
    other = Job.objects.get(pk=made.json()["id"])
    first = s.JobSubmitOut(job, context={"translated_from": "slurm", "warnings": ["a"]})
    second = s.JobSubmitOut(other, context={"translated_from": None, "warnings": []})
    assert first.fields["team"] is not second.fields["team"]
    second_data, first_data = second.data, first.data
    assert (first_data["id"], first_data["translated_from"], first_data["warnings"]) == (job.pk, "slurm", ["a"])
    assert (second_data["id"], second_data["translated_from"], second_data["warnings"]) == (other.pk, None, [])
    assert len(first_data["tasks"]) == 2 and second_data["tasks"] == []


def test_answers_built_in_parallel_threads_are_each_their_own(cast, nodes):
    client = token_client(cast.ci_token)
    ids = [client.post("/api/v1/jobs", job_body(cast.org.team_a, name=f"j{i}"), format="json").json()["id"] for i in range(4)]
    # Read whole here: the threads' own connections would not see this test's rows.
    jobs = list(Job.objects.select_related("team", "user").prefetch_related("tasks", "events").filter(pk__in=ids))
    wrong: list[str] = []

    def render(job: Job) -> None:
        for n in range(300):
            data = s.JobSubmitOut(job, context={"translated_from": f"{job.pk}-{n}", "warnings": []}).data
            if (data["name"], data["translated_from"]) != (job.name, f"{job.pk}-{n}"):
                wrong.append(f"{job.name}: {data['name']} {data['translated_from']}")

    threads = [threading.Thread(target=render, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == []


def test_two_bodies_checked_at_once_keep_their_own_errors_and_values(cast):
    bad = s.JobSubmitIn(data={"name": "x", "team": "t", "command": "", "replicas": 0, "env": {"A": 1}})
    good = s.JobSubmitIn(data={"name": "y", "team": "u", "command": "true", "replicas": 3, "env": {"B": "2"}})
    assert good.is_valid() and not bad.is_valid()
    assert set(bad.errors) == {"command", "replicas"}
    assert (good.validated_data["replicas"], good.validated_data["env"]) == (3, {"B": "2"})


# --------------------------------------------------------------------------- one statement, compiled once


def _rows(job: Job) -> tuple[dict, list[dict], list[dict]]:
    """The job's columns, its events' and its audit entries', bar ids and the audit entry's own time."""
    from tenants.models import AuditEntry

    row = dict(Job.objects.filter(pk=job.pk).values().get())
    row.pop("id")
    row["checkpoint_dir"] = row["checkpoint_dir"].removesuffix(f"/{job.pk}")
    events = list(
        JobEvent.objects.filter(job=job).values("time", "attempt", "from_state", "to_state", "reason", "actor_id", "actor_label")
    )
    audits = list(
        AuditEntry.objects.filter(object_type="job", object_id=str(job.pk)).values(
            "actor_id", "actor_label", "action", "unit_id", "message", "data"
        )
    )
    return row, events, audits


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"checkpoint_dir": "team-a/ckpt/../run-7", "priority": 5, "env": {"A": "1"}},
        {"image": "python:3.12", "container_mounts": "/data:/data:ro", "container_workdir": "/work"},
    ],
)
def test_the_one_statement_writes_the_rows_the_orm_writes(cast, nodes, settings, changes):
    from django.utils import timezone

    from scheduling.services import submit

    if "checkpoint_dir" in changes:
        changes = {**changes, "checkpoint_dir": f"{settings.YARD['CHECKPOINT_ROOT']}/{changes['checkpoint_dir']}"}
    spec, verdict, now = submit.job_admit(
        user=cast.ann, spec=submit.JobSpec(name="same", team=cast.org.team_a, command="true", **changes)
    )
    old = submit._create_job(user=cast.ann, spec=spec, key="k-orm", copied_from=None, now=now, verdict=verdict)
    new = submit._insert_job(user=cast.ann, spec=spec, key="k-sql", copied_from=old, now=now, verdict=verdict)
    assert new is not None and new.pk != old.pk
    orm, sql = _rows(old), _rows(new)
    assert (sql[0].pop("idempotency_key"), orm[0].pop("idempotency_key")) == ("k-sql", "k-orm")
    assert (sql[0].pop("copied_from_id"), orm[0].pop("copied_from_id")) == (old.pk, None)
    for audits in (orm[2], sql[2]):
        audits[0]["data"].pop("idempotency_key")
        audits[0]["data"].pop("copied_from")
    assert sql == orm
    # What the answer shows of the new job is what was written.
    assert (new.checkpoint_dir, new.submit_event.pk) == (
        Job.objects.get(pk=new.pk).checkpoint_dir,
        JobEvent.objects.get(job=new).pk,
    )
    assert new.submitted_at == now and new.submitted_at <= timezone.now()


def test_the_one_statement_writes_nothing_for_a_key_already_used(cast, nodes):
    from scheduling.services import submit

    spec, verdict, now = submit.job_admit(user=cast.ann, spec=submit.JobSpec(name="k", team=cast.org.team_a, command="true"))
    first = submit._insert_job(user=cast.ann, spec=spec, key="once", copied_from=None, now=now, verdict=verdict)
    again = submit._insert_job(user=cast.ann, spec=spec, key="once", copied_from=None, now=now, verdict=verdict)
    assert first is not None and again is None
    assert Job.objects.filter(user=cast.ann, idempotency_key="once").count() == 1
    assert JobEvent.objects.filter(job__user=cast.ann, job__idempotency_key="once").count() == 1


@pytest.mark.parametrize("copied", [False, True])
def test_the_statement_with_its_nulls_written_in_is_the_one_with_them_bound(cast, nodes, copied):
    import psycopg
    from django.db import connection

    from scheduling.services import job_insert, submit

    spec, verdict, now = submit.job_admit(user=cast.ann, spec=submit.JobSpec(name="n", team=cast.org.team_a, command="true"))
    copied_from = submit._insert_job(user=cast.ann, spec=spec, key="src", copied_from=None, now=now, verdict=verdict)
    job = submit._new_job(
        user=cast.ann, spec=spec, key="k", copied_from=copied_from if copied else None, now=now, verdict=verdict
    )
    values = job_insert.job_values(job)
    nulls = tuple(v is None for v in values)
    assert any(nulls) and not all(nulls)
    tail = ["/ckpt", "/team", now, "PENDING", "why", cast.ann.pk, "ann", now, cast.ann.pk, "ann", cast.org.team_a.pk, "m", "{}"]
    bound = [Job._meta.db_table, *values, *tail]
    literal = [Job._meta.db_table, *(v for v in values if v is not None), *tail]
    connection.ensure_connection()
    cursor = psycopg.ClientCursor(connection.connection)
    sent = cursor.mogrify(job_insert.insert_sql(nulls), literal)
    assert sent == cursor.mogrify(job_insert.insert_sql((False,) * len(values)), bound)
    # Few enough parameters that psycopg parses the statement once, not at every submission.
    assert len(literal) <= psycopg._queries.MAX_CACHED_STATEMENT_PARAMS < len(bound)


def test_the_compiled_reads_answer_as_the_orm_does(cast, nodes):
    from scheduling.selectors import quotas
    from tenants import selectors
    from tenants.models import ApiToken, Membership, OrgUnit, hash_token
    from tenants.services import _TOKEN_BY_HASH

    token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(cast.ci_token)).first()
    [compiled] = _TOKEN_BY_HASH.objects(hash_token(cast.ci_token))
    assert (compiled.pk, compiled.user.username, compiled.team_id, compiled.expires_at) == (
        token.pk, token.user.username, token.team_id, token.expires_at
    )  # fmt: skip
    assert _TOKEN_BY_HASH.objects(hash_token("ym_no-such-token")) == []
    for user in (cast.ann, token.user):
        ms = list(Membership.objects.filter(user=user).select_related("unit"))
        got = selectors._MEMBERSHIPS.objects(user.pk)
        assert [(m.pk, m.role, m.unit.pk, m.unit.path, m.unit.kind) for m in got] == [
            (m.pk, m.role, m.unit.pk, m.unit.path, m.unit.kind) for m in ms
        ]
    for unit in OrgUnit.objects.all():
        for gpu_type in ("H100", "A100"):
            ids = [int(p) for p in unit.path.strip("/").split("/") if p] or [unit.pk]
            assert quotas._chain_query(len(ids)).rows(*ids, gpu_type) == list(quotas._chain_rows(*ids, gpu_type))


def test_a_compiled_read_refuses_a_sentinel_it_cannot_find():
    from tenants.compiled import CompiledQuery
    from tenants.models import OrgUnit

    query = CompiledQuery(lambda slug: OrgUnit.objects.filter(slug__icontains=slug), "sentinel")
    with pytest.raises(ValueError, match="appears 0 times"):
        query.rows("x")
