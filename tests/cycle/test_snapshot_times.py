"""The snapshot's times of running jobs are the jobs' own, to the microsecond (``selectors.Epoch``: the
database computes them, rather than Python parsing thousands of datetimes every cycle)."""

from datetime import UTC, datetime

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Job
from scheduling.selectors import snapshot_build
from scheduling.services import JobSpec, job_submit

pytestmark = pytest.mark.django_db


def test_running_jobs_keep_their_start_submit_and_checkpoint_times(org, ann, nodes):
    jobs = [job_submit(user=ann, spec=JobSpec(name=f"train-{i}", team=org.team_a, command="true")) for i in range(2)]
    run_cycle_once()
    started = datetime(2026, 11, 30, 8, 15, 42, 123457, tzinfo=UTC)
    checkpoint = datetime(2026, 11, 30, 9, 0, 0, 1, tzinfo=UTC)
    Job.objects.filter(pk=jobs[0].pk).update(started_at=started, last_checkpoint_at=checkpoint)
    Job.objects.filter(pk=jobs[1].pk).update(started_at=None, state_changed_at=started.replace(microsecond=0))
    running = {r.job_id: r for r in snapshot_build(now=timezone.now()).running}
    first, second = running[str(jobs[0].pk)], running[str(jobs[1].pk)]
    assert (first.start, first.last_checkpoint) == (started.timestamp(), checkpoint.timestamp())
    assert first.submit_time == Job.objects.get(pk=jobs[0].pk).submitted_at.timestamp()
    # Not started yet (still launching): the time it was placed, and no checkpoint.
    assert (second.start, second.last_checkpoint) == (started.replace(microsecond=0).timestamp(), None)
