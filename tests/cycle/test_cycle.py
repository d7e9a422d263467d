"""The cycle's apply step: fencing by lease epoch, whole-gang rollback, reasons, preemption."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.core.plan import plan
from scheduling.cycle import apply_plan, run_cycle_once
from scheduling.cycle_lease import LeaseLost, lease_claim, lease_release
from scheduling.models import Allocation, Job, SchedulerLease, Task
from scheduling.selectors import invariant_violations, snapshot_build
from scheduling.services import QUEUED, JobSpec, job_submit, task_mark_running
from scheduling.states import JobState
from tenants.models import AuditEntry
from tests.factories import make_cluster, make_user

pytestmark = pytest.mark.django_db


def submit(org, user, **kw):
    kw.setdefault("command", "true")
    return job_submit(user=user, spec=JobSpec(name="train", team=kw.pop("team", org.team_a), **kw))


def expire_lease():
    SchedulerLease.objects.filter(name="cycle").update(expires_at=timezone.now() - timedelta(seconds=1))


def test_lease_cannot_be_claimed_while_held(nodes):
    held = lease_claim()
    assert held is not None
    assert lease_claim() is None
    lease_release(held)


def test_expired_lease_is_claimed_with_a_higher_epoch(nodes):
    first = lease_claim()
    expire_lease()
    second = lease_claim()
    assert second is not None and second.epoch == first.epoch + 1
    lease_release(second)
    lease_release(first)  # its session lock, if it took one


def test_paused_holder_resuming_after_a_takeover_gets_no_write_accepted(org, ann, nodes):
    job = submit(org, ann, replicas=2, gpus_per_replica=8)
    old = lease_claim()
    now = timezone.now()
    snapshot = snapshot_build(now=now)
    stale_plan = plan(snapshot, now=now.timestamp())
    assert stale_plan.placements
    # old pauses past its lease; a new holder takes over
    expire_lease()
    assert lease_claim() is not None
    with pytest.raises(LeaseLost):
        apply_plan(lease=old, snapshot=snapshot, plan_=stale_plan, now=now)
    job.refresh_from_db()
    assert job.state == JobState.PENDING
    assert not Task.objects.exists() and not Allocation.objects.exists()
    assert job.pending_reason == QUEUED  # what submission said: not even the reasons were written


def test_gang_whose_gpus_were_taken_meanwhile_is_rolled_back_whole(org, ann, nodes):
    # Two plans made from the same snapshot both want the same GPUs for different jobs.
    first = submit(org, ann, replicas=2, gpus_per_replica=8)
    now = timezone.now()
    lease = lease_claim()
    snapshot = snapshot_build(now=now)
    plan_first = plan(snapshot, now=now.timestamp())
    Job.objects.filter(pk=first.pk).update(state=JobState.CANCELLED)
    second = submit(org, ann, replicas=2, gpus_per_replica=8)
    plan_second = plan(snapshot_build(now=now), now=now.timestamp())
    apply_plan(lease=lease, snapshot=snapshot, plan_=plan_second, now=now)
    # the first plan's placement now collides with the second job's allocations
    Job.objects.filter(pk=first.pk).update(state=JobState.PENDING)
    result = apply_plan(lease=lease, snapshot=snapshot, plan_=plan_first, now=now)
    assert result.conflicts == [first.pk] and result.placed == []
    first.refresh_from_db()
    assert first.state == JobState.PENDING
    assert not Task.objects.filter(job=first).exists()
    assert Allocation.objects.filter(job=second, released_at__isnull=True).count() == 16
    assert invariant_violations() == []


def test_unplaceable_job_gets_a_pending_reason_and_unchanged_rows_are_not_rewritten(org, ann, nodes):
    big = submit(org, ann, replicas=4, gpus_per_replica=8)
    run_cycle_once()
    waiting = submit(org, ann, replicas=4, gpus_per_replica=8)
    run_cycle_once()
    waiting.refresh_from_db()
    big.refresh_from_db()
    assert big.state == JobState.STARTING
    assert waiting.state == JobState.PENDING and waiting.pending_reason
    again = run_cycle_once()
    assert again.reasons_updated == 0


def test_cycle_preempts_a_spot_job_for_a_job_within_guarantee(org, ann, settings):
    settings.YARD = {**settings.YARD, "MIN_RUNTIME_S": 0.0}
    make_cluster(nodes=6)  # 48 GPUs: the two spot jobs fill it
    bea = make_user("bea", unit=org.team_c)
    spot = submit(org, bea, team=org.team_c, replicas=2, gpus_per_replica=8, tier=3)
    filler = submit(org, ann, replicas=4, gpus_per_replica=8, tier=3)
    run_cycle_once()
    for j in (spot, filler):
        j.refresh_from_db()
        assert j.state == JobState.STARTING
    for task in Task.objects.all():
        task_mark_running(task=task, pid=1, started_at=timezone.now())
    Job.objects.filter(pk__in=[spot.pk, filler.pk]).update(started_at=timezone.now() - timedelta(hours=1))
    cid = make_user("cid", unit=org.team_b)
    wanted = submit(org, cid, team=org.team_b, replicas=1, gpus_per_replica=8, tier=2)
    result = run_cycle_once()
    assert result.preempted, Job.objects.get(pk=wanted.pk).pending_reason
    victim = Job.objects.get(pk=result.preempted[0])
    assert victim.state == JobState.PREEMPTING and victim.stop_reason == "PREEMPTED"
    assert AuditEntry.objects.filter(action="job.preempt", object_id=str(victim.pk), actor_label="scheduler").count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_holder_that_stalls_mid_apply_stops_writing_once_another_takes_over(org, ann, nodes, monkeypatch):
    import threading

    from django.db import connection

    from scheduling.cycle import APPLY_PAUSE_ENV

    jobs = [submit(org, ann, replicas=1, gpus_per_replica=8) for _ in range(4)]
    monkeypatch.setenv(APPLY_PAUSE_ENV, "1.0")  # the stalled holder sleeps after each gang
    outcome = {}

    def stalled_cycle():
        try:
            outcome["result"] = run_cycle_once()
        finally:
            connection.close()

    thread = threading.Thread(target=stalled_cycle)
    thread.start()
    deadline = time.monotonic() + 20
    while not Job.objects.filter(state=JobState.STARTING).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    expire_lease()
    assert lease_claim() is not None  # the takeover
    thread.join(timeout=30)
    assert outcome["result"].ran is False
    assert Job.objects.filter(pk__in=[j.pk for j in jobs], state=JobState.STARTING).count() == 1
    assert invariant_violations() == []
