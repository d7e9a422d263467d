"""The pending reasons, estimated starts and reservation domains a cycle writes, in one statement per
batch (``cycle._write_reasons``): each job gets its own row's values, NULL estimates included."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from scheduling.cycle import _write_reasons
from scheduling.models import Job
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState

pytestmark = pytest.mark.django_db


def test_each_job_gets_its_own_reason_estimate_and_domain_in_one_statement(org, ann, nodes):
    jobs = [job_submit(user=ann, spec=JobSpec(name=f"j{i}", team=org.team_a, command="true")) for i in range(4)]
    other = job_submit(user=ann, spec=JobSpec(name="other", team=org.team_a, command="true"))
    start = 1_800_000_000.25
    rows = [
        (jobs[0].pk, "waiting behind a reservation for job 'a' (starts in ~2 h on leaf-1)", start, "leaf-1"),
        (jobs[1].pk, 'over team vision quota — naïve 100% "quoted"', None, ""),
        (jobs[2].pk, "same reason", start + 60, ""),
        (jobs[3].pk, "same reason", start + 60, ""),
    ]
    with CaptureQueriesContext(connection) as queries:
        assert _write_reasons(rows) == 4
    assert len(queries) == (2 if connection.vendor == "postgresql" else 3)  # the lock, the update (SQLite: its count)
    got = {
        j.pk: (j.pending_reason, j.estimated_start, j.reservation_domain) for j in Job.objects.filter(pk__in=[j.pk for j in jobs])
    }
    assert got[jobs[0].pk] == (rows[0][1], datetime.fromtimestamp(start, tz=UTC), "leaf-1")
    assert got[jobs[1].pk] == (rows[1][1], None, "")
    assert got[jobs[2].pk] == got[jobs[3].pk] == ("same reason", datetime.fromtimestamp(start + 60, tz=UTC), "")
    untouched = Job.objects.get(pk=other.pk)
    assert (untouched.pending_reason, untouched.estimated_start) == (other.pending_reason, other.estimated_start)


def test_a_job_placed_or_cancelled_since_keeps_what_it_says(org, ann, nodes):
    waiting = job_submit(user=ann, spec=JobSpec(name="waiting", team=org.team_a, command="true"))
    gone = job_submit(user=ann, spec=JobSpec(name="gone", team=org.team_a, command="true"))
    Job.objects.filter(pk=gone.pk).update(state=JobState.CANCELLED, pending_reason="")
    assert _write_reasons([(waiting.pk, "new reason", None, ""), (gone.pk, "new reason", None, "")]) == 1
    assert Job.objects.get(pk=waiting.pk).pending_reason == "new reason"
    assert Job.objects.get(pk=gone.pk).pending_reason == ""


def test_nothing_to_write_is_no_statement(db):
    with CaptureQueriesContext(connection) as queries:
        assert _write_reasons([]) == 0
    assert len(queries) == 0
