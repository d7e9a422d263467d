"""The preview names what the next cycle does: the same victims, the same start, the same words.

The preview (POST /api/v1/jobs/preview, services.job_preview) plans the new job as "new"; the cycle
plans it under its database id. Here a job already queued ties with it on submit time and the ids
cross a power of ten (99, then 100), so a queue ordered by ids as text would put the new job first in
the cycle and last in the preview, and the two would name different victims (issue 13: the reason
said "preempting 1 job(s) (6)", the cycle preempted job 7).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Task
from scheduling.services import JobSpec, job_preview, job_submit, task_mark_running
from scheduling.states import JobState
from tenants.services import quota_set, token_create_personal
from tests.api.conftest import token_client
from tests.factories import make_cluster, make_org, make_user

pytestmark = pytest.mark.django_db


def _next_job_id_is(pk: int) -> None:
    """Make the database hand out ``pk`` as the next job id."""
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT setval(pg_get_serial_sequence(%s, 'id'), %s)", [table, pk - 1])
        else:
            cursor.execute("UPDATE sqlite_sequence SET seq = %s WHERE name = %s", [pk - 1, table])


def _spot_jobs_running(org, now):
    """Two spot jobs of another team on the two nodes, both in its guarantee (so of one victim class);
    "cheap" checkpointed 5 min ago, "dear" 50 min ago."""
    quota_set(actor=None, unit=org.team_c, gpu_type="H100", guaranteed=16, limit=16)
    bea = make_user("bea", unit=org.team_c)
    spec = JobSpec(name="spot", team=org.team_c, command="true", tier=3, replicas=1, gpus_per_replica=8)
    jobs = [job_submit(user=bea, spec=spec) for _ in range(2)]
    run_cycle_once(now=now - timedelta(hours=1))
    for task in Task.objects.all():
        task_mark_running(task=task, pid=1, started_at=now - timedelta(hours=1))
    cheap, dear = jobs
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(started_at=now - timedelta(hours=1))
    Job.objects.filter(pk=cheap.pk).update(last_checkpoint_at=now - timedelta(minutes=5))
    Job.objects.filter(pk=dear.pk).update(last_checkpoint_at=now - timedelta(minutes=50))
    return cheap, dear


@pytest.fixture
def moment(monkeypatch):
    """One instant for the preview, the submissions and the cycle: "given the same state"."""
    now = timezone.now().replace(microsecond=0)
    monkeypatch.setattr(timezone, "now", lambda: now)
    return now


def test_the_preview_names_the_victim_and_start_the_next_cycle_acts_on(moment):
    org = make_org()
    make_cluster(nodes=2, leaves_per_spine=1)  # 16 H100, both held by the spot jobs
    cheap, dear = _spot_jobs_running(org, moment)
    for job in (cheap, dear):
        assert Job.objects.get(pk=job.pk).state in (JobState.STARTING, JobState.RUNNING)
    ann = make_user("ann", unit=org.team_a)
    spec = JobSpec(name="train", team=org.team_a, command="true", tier=2, replicas=1, gpus_per_replica=8)
    _next_job_id_is(99)
    queued = job_submit(user=ann, spec=spec)  # id 99, ties with the new job on submit time
    assert queued.pk == 99

    token = token_create_personal(user=ann, name="laptop", expires_at=None).raw
    body = {"name": "train", "team": org.team_a.slug, "tier": 2, "replicas": 1, "gpus_per_replica": 8, "command": "true"}
    answer = token_client(token).post("/api/v1/jobs/preview", body, format="json")
    assert answer.status_code == 200, answer.content
    previewed = answer.json()["verdict"]
    assert previewed == job_preview(user=ann, spec=spec).reason
    # Job 99 is first in the queue, so it takes the victim with less work to lose; the new job the other.
    assert f"preempting 1 job(s) ({dear.pk})" in previewed, previewed

    new = job_submit(user=ann, spec=spec)
    assert new.pk == 100
    result = run_cycle_once(now=moment)
    assert sorted(result.preempted) == sorted([cheap.pk, dear.pk])
    new.refresh_from_db()
    assert new.state == JobState.PENDING
    assert previewed == f"waits ~60 s: {new.pending_reason}"
    assert new.estimated_start == moment + timedelta(seconds=60)
    notes = {e.job_id: e.reason for e in Job.objects.get(pk=dear.pk).events.filter(to_state=JobState.PREEMPTING)}
    assert f"reclaimed for job {new.name} (#{new.pk})" in notes[dear.pk]
