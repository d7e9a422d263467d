"""Cycles in real Celery workers on PostgreSQL: concurrency, churn and a SIGKILL mid-apply.

The workers are separate processes (`celery -A portal worker`) on pytest-django's test database;
the test process drives churn through the services, as agents and users would.
"""

from __future__ import annotations

import random
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from portal.celery import app
from scheduling.cycle import APPLY_PAUSE_ENV, run_cycle_once
from scheduling.models import Allocation, Job, JobEvent, SchedulerLease, Task
from scheduling.selectors import invariant_violations
from scheduling.services import JobSpec, job_cancel, job_submit, task_mark_exited, task_mark_running
from scheduling.states import JobState, TaskState
from scheduling.tasks import run_cycle
from tests.cycle.workers import Worker
from tests.factories import make_shared_cluster

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

SHAPES = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (4, 8), (8, 8)]


@pytest.fixture
def workers(transactional_db, tmp_path):
    app.control.purge()  # stale cycle requests of earlier tests
    started: list[Worker] = []

    def start(n: int, **env: str) -> list[Worker]:
        batch = [Worker(f"w{len(started) + i + 1}", tmp_path, YARD_CYCLE_LEASE_S="5", **env) for i in range(n)]
        started.extend(batch)
        for w in batch:
            w.wait_ready()
        return batch

    yield start
    for w in started:
        w.stop()


def _epoch() -> int:
    return SchedulerLease.objects.filter(name="cycle").values_list("epoch", flat=True).first() or 0


def _lifetime_s(job_id: int) -> int:
    """5-30 s, fixed per job: long enough that the cluster fills up and gangs queue, reserve and preempt."""
    return 5 + job_id * 7919 % 26


def _advance(rng: random.Random, now) -> None:
    """What agents would report: starts, ends (mostly clean), and preempted gangs going down."""
    for task in Task.objects.filter(state=TaskState.ASSIGNED).select_related("job")[:200]:
        task_mark_running(task=task, pid=1000 + task.pk, started_at=now)
    ending = Job.objects.filter(state__in=(JobState.RUNNING, JobState.PREEMPTING))
    for job in ending:
        due = job.state == JobState.PREEMPTING or job.stop_requested_at is not None
        if not due and job.started_at and now - job.started_at < timedelta(seconds=_lifetime_s(job.pk)):
            continue
        code = 0 if not due and rng.random() < 0.9 else (143 if due else 1)
        for task in Task.objects.filter(job=job, attempt=job.attempt, state__in=(TaskState.RUNNING, TaskState.STOPPING)):
            task_mark_exited(task=task, exit_code=code, signal=None, stopped_by="sigterm" if due else "", ended_at=now)


def test_two_workers_under_a_minute_of_churn_on_200_nodes_keep_every_invariant(workers):
    rng = random.Random(7)
    users = make_shared_cluster(200)
    pool = workers(2, YARD_MIN_RUNTIME_S="0")  # spot gangs become preemptible at once
    problems: list[str] = []
    checks = 0
    last_epoch = _epoch()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for _ in range(4):
            user, team = rng.choice(users)
            replicas, gpus = rng.choice(SHAPES)
            tier = rng.choice((2, 2, 3))
            job_submit(
                user=user,
                spec=JobSpec(name="churn", team=team, tier=tier, replicas=replicas, gpus_per_replica=gpus, command="true"),
            )
        pending = list(Job.objects.filter(state=JobState.PENDING).order_by("?")[:1])
        if pending and rng.random() < 0.2:
            job_cancel(job=pending[0], actor=pending[0].user)
        run_cycle.delay()
        run_cycle.delay()  # two requests at once: both workers race for the lease
        _advance(rng, timezone.now())
        epoch = _epoch()
        if epoch != last_epoch:  # a cycle ran since the last look
            last_epoch = epoch
            checks += 1
            problems.extend(invariant_violations())
    # The cycles still running end (the lease is released or runs out) before the last look.
    deadline = time.monotonic() + 30
    while SchedulerLease.objects.filter(name="cycle", holder__gt="", expires_at__gt=timezone.now()).exists():
        assert time.monotonic() < deadline, "a cycle still held the lease 30 s after the churn"
        time.sleep(0.1)
    problems.extend(invariant_violations())
    assert problems == []
    assert checks >= 10
    assert all(w.cycles_run() > 0 for w in pool), [w.cycles_run() for w in pool]
    placed = Job.objects.exclude(state=JobState.PENDING).exclude(state=JobState.CANCELLED, started_at__isnull=True).count()
    assert placed >= 50
    preempted = JobEvent.objects.filter(to_state=JobState.PREEMPTED).count()
    print(f"{checks} invariant checks, {_epoch()} cycles, {placed} jobs placed, {preempted} preemptions")


def test_worker_killed_mid_apply_leaves_whole_gangs_and_the_next_cycle_places_the_rest(workers, settings):
    users = make_shared_cluster(16)
    user, team = users[0]
    jobs = [
        job_submit(user=user, spec=JobSpec(name=f"gang-{i}", team=team, replicas=2, gpus_per_replica=8, command="true"))
        for i in range(6)
    ]
    [worker] = workers(1, **{APPLY_PAUSE_ENV: "1.5"})
    app.control.purge()
    run_cycle.delay()
    deadline = time.monotonic() + 30
    while Job.objects.filter(state=JobState.STARTING).count() < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    worker.kill()  # SIGKILL, between (or inside) gang transactions
    placed_before = Job.objects.filter(state=JobState.STARTING).count()
    assert 2 <= placed_before < len(jobs)
    assert invariant_violations() == []
    # the dead worker's lease runs out (5 s here); the next cycle (in this process) finishes the work
    lease = SchedulerLease.objects.get(name="cycle")
    time.sleep(max((lease.expires_at - timezone.now()).total_seconds(), 0) + 0.2)
    result = run_cycle_once()
    assert result.ran and len(result.placed) == len(jobs) - placed_before
    assert invariant_violations() == []
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.STARTING).count() == len(jobs)
    assert Allocation.objects.filter(released_at__isnull=True).count() == len(jobs) * 16
