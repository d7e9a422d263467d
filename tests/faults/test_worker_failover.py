"""kill -9 of the Celery worker that holds the cycle, mid-apply: the other worker runs the next cycle
within seconds (its holder's PostgreSQL session, and with it the session lock, died with it), not
after the lease runs out; what the dead one had written stands whole, and the rest is placed."""

from __future__ import annotations

import time

import pytest

from portal.celery import app
from scheduling.cycle import APPLY_PAUSE_ENV
from scheduling.models import Allocation, Job, SchedulerLease
from scheduling.selectors import invariant_violations
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState
from scheduling.tasks import run_cycle
from tests.cycle.workers import Worker
from tests.factories import make_shared_cluster

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_other_worker_runs_a_cycle_within_seconds_of_the_holder_being_killed(transactional_db, tmp_path) -> None:
    app.control.purge()
    users = make_shared_cluster(16)
    user, team = users[0]
    jobs = [
        job_submit(user=user, spec=JobSpec(name=f"gang-{i}", team=team, replicas=2, gpus_per_replica=8, command="true"))
        for i in range(6)
    ]
    # The default lease (8 s) and a slow apply (1.5 s between gangs), so the kill lands mid-cycle.
    workers = [Worker(f"f{i}", tmp_path, **{APPLY_PAUSE_ENV: "1.5"}) for i in (1, 2)]
    try:
        for w in workers:
            w.wait_ready()
        run_cycle.delay()
        deadline = time.monotonic() + 30
        while Job.objects.filter(state=JobState.STARTING).count() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        lease = SchedulerLease.objects.get(name="cycle")
        holder = next(w for w in workers if f":{w.proc.pid}:" in lease.holder)
        other = next(w for w in workers if w is not holder)
        holder.kill()
        killed = time.monotonic()
        epoch = lease.epoch
        placed_before = Job.objects.filter(state=JobState.STARTING).count()
        assert invariant_violations() == []
        # Beat's tick, once a second here: the surviving worker claims the cycle as soon as it may.
        taken = None
        while time.monotonic() - killed < 30:
            run_cycle.delay()
            now = SchedulerLease.objects.get(name="cycle")
            if now.epoch > epoch and f":{other.proc.pid}:" in now.holder:
                taken = time.monotonic() - killed
                break
            time.sleep(1.0)
        assert taken is not None, "the surviving worker never took the cycle"
        deadline = time.monotonic() + 60
        while (
            Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.STARTING).count() < len(jobs)
            and time.monotonic() < deadline
        ):
            time.sleep(0.2)
        print(
            f"holder killed mid-apply with {placed_before} of {len(jobs)} gangs written; "
            f"the other worker took the cycle {taken:.1f} s later"
        )
        assert taken <= 10.0
        assert Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.STARTING).count() == len(jobs)
        assert Allocation.objects.filter(released_at__isnull=True).count() == len(jobs) * 16
        assert invariant_violations() == []
    finally:
        for w in workers:
            w.stop()
