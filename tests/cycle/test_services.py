"""The job lifecycle services: submit, cancel, stop, requeue, task reports, node loss."""

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Allocation, Job, Task
from scheduling.selectors import invariant_violations
from scheduling.services import (
    IdempotencyConflict,
    JobSpec,
    job_cancel,
    job_preview,
    job_request_stop,
    job_submit,
    node_mark_lost,
    task_mark_exited,
    task_mark_running,
)
from scheduling.states import JobState, TaskState
from tenants.models import AuditEntry

pytestmark = pytest.mark.django_db


def spec(org, **kw):
    kw.setdefault("command", "true")
    return JobSpec(name=kw.pop("name", "train"), team=kw.pop("team", org.team_a), **kw)


def placed(org, user, **kw) -> Job:
    job = job_submit(user=user, spec=spec(org, **kw))
    run_cycle_once()
    job.refresh_from_db()
    assert job.state == JobState.STARTING, job.pending_reason
    return job


def run_all(job: Job) -> list[Task]:
    tasks = list(Task.objects.filter(job=job, attempt=job.attempt))
    for t in tasks:
        task_mark_running(task=t, pid=100 + t.rank, started_at=timezone.now())
    return tasks


def exit_all(tasks, code=0, stopped_by=""):
    for t in tasks:
        task_mark_exited(task=t, exit_code=code, signal=None, stopped_by=stopped_by, ended_at=timezone.now())


def test_submit_creates_a_pending_job_with_an_event_and_an_audit_entry(org, ann, nodes):
    job = job_submit(user=ann, spec=spec(org, replicas=2, gpus_per_replica=8))
    assert job.state == JobState.PENDING
    assert job.checkpoint_dir.endswith(f"/{org.team_a.slug}/{job.pk}")
    assert job.events.get().to_state == JobState.PENDING
    assert AuditEntry.objects.filter(action="job.submit", object_id=str(job.pk)).count() == 1


def test_submit_for_a_team_the_user_is_not_in_is_a_field_error(org, ann, nodes):
    with pytest.raises(ValidationError) as err:
        job_submit(user=ann, spec=spec(org, team=org.team_c))
    assert "team" in err.value.message_dict
    assert not Job.objects.exists()


def test_submit_that_can_never_fit_is_refused_by_admission(org, ann, nodes):
    with pytest.raises(ValidationError) as err:
        job_submit(user=ann, spec=spec(org, replicas=1, gpus_per_replica=16))
    assert "gpus_per_replica" in err.value.message_dict or "__all__" in err.value.message_dict
    with pytest.raises(ValidationError) as err:
        job_submit(user=ann, spec=spec(org, gpu_type="B200"))
    assert "never run" in str(err.value)


def test_checkpoint_dir_outside_the_team_directory_is_refused(org, ann, nodes):
    with pytest.raises(ValidationError) as err:
        job_submit(user=ann, spec=spec(org, checkpoint_dir="/etc/../tmp/x"))
    assert "checkpoint_dir" in err.value.message_dict


def test_same_idempotency_key_twice_gives_the_same_job(org, ann, nodes):
    first = job_submit(user=ann, spec=spec(org), idempotency_key="ci-123")
    second = job_submit(user=ann, spec=spec(org), idempotency_key="ci-123")
    assert first.pk == second.pk
    assert Job.objects.count() == 1


def test_same_idempotency_key_with_another_spec_conflicts(org, ann, nodes):
    job_submit(user=ann, spec=spec(org), idempotency_key="ci-123")
    with pytest.raises(IdempotencyConflict):
        job_submit(user=ann, spec=spec(org, replicas=2), idempotency_key="ci-123")
    assert Job.objects.count() == 1


def test_preview_says_where_it_would_fit(org, ann, nodes):
    verdict = job_preview(user=ann, spec=spec(org, replicas=2, gpus_per_replica=8))
    assert verdict.ok and "fits now" in verdict.reason


def test_cycle_places_a_gang_with_tasks_ranks_master_and_allocations(org, ann, nodes):
    job = placed(org, ann, replicas=2, gpus_per_replica=8)
    tasks = list(Task.objects.filter(job=job).order_by("rank"))
    assert [t.rank for t in tasks] == [0, 1]
    assert {t.master_addr for t in tasks} == {tasks[0].node.address}
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 16
    assert "placed on leaf-" in job.events.last().reason
    assert job.locality == "leaf"
    assert AuditEntry.objects.filter(action="job.place", object_id=str(job.pk)).count() == 1
    assert invariant_violations() == []


def test_job_runs_when_every_rank_runs(org, ann, nodes):
    job = placed(org, ann, replicas=2, gpus_per_replica=8)
    tasks = list(Task.objects.filter(job=job))
    task_mark_running(task=tasks[0], pid=1, started_at=timezone.now())
    job.refresh_from_db()
    assert job.state == JobState.STARTING
    task_mark_running(task=tasks[1], pid=2, started_at=timezone.now())
    job.refresh_from_db()
    assert job.state == JobState.RUNNING


def test_all_ranks_exiting_zero_completes_and_frees_gpus(org, ann, nodes):
    job = placed(org, ann, replicas=2, gpus_per_replica=4)
    exit_all(run_all(job))
    job.refresh_from_db()
    assert job.state == JobState.COMPLETED and job.exit_code == 0
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()


def test_a_failing_rank_stops_the_others_and_the_job_fails(org, ann, nodes):
    job = placed(org, ann, replicas=2, gpus_per_replica=4)
    t0, t1 = run_all(job)
    task_mark_exited(task=t0, exit_code=3, signal=None, stopped_by="", ended_at=timezone.now())
    t1.refresh_from_db()
    assert t1.state == TaskState.STOPPING
    task_mark_exited(task=t1, exit_code=143, signal=None, stopped_by="sigterm", ended_at=timezone.now())
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.exit_code == 3


def test_cancel_of_a_running_job_orders_a_stop_then_ends_cancelled(org, ann, nodes):
    job = placed(org, ann)
    tasks = run_all(job)
    job = job_cancel(job=job, actor=ann)
    assert job.stop_reason == "CANCELLED" and job.state == JobState.RUNNING
    exit_all(tasks, code=143, stopped_by="sigterm")
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_second_stop_order_changes_nothing(org, ann, nodes):
    job = placed(org, ann)
    run_all(job)
    job_request_stop(job=job, reason="IDLE_TIMEOUT", actor_label="reaper-1")
    events = job.events.count()
    again = job_request_stop(job=job, reason="IDLE_TIMEOUT", actor_label="reaper-2")
    assert again.stop_reason == "IDLE_TIMEOUT"
    assert job.events.count() == events


def test_preempted_job_is_requeued_with_its_checkpoint_dir(org, ann, nodes):
    job = placed(org, ann, replicas=2, gpus_per_replica=8)
    tasks = run_all(job)
    job_request_stop(job=job, reason="PREEMPTED", grace_s=30, actor_label="scheduler")
    job.refresh_from_db()
    assert job.state == JobState.PREEMPTING
    checkpoint = job.checkpoint_dir
    exit_all(tasks, code=143, stopped_by="sigterm")
    job.refresh_from_db()
    assert (job.state, job.attempt, job.checkpoint_dir) == (JobState.PENDING, 2, checkpoint)
    assert [e.to_state for e in job.events.all()][-2:] == [JobState.PREEMPTED, JobState.PENDING]


def test_time_limit_stop_ends_failed(org, ann, nodes):
    job = placed(org, ann, time_limit_s=60)
    tasks = run_all(job)
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timezone.timedelta(seconds=120))
    result = run_cycle_once()
    assert result.time_limited == [job.pk]
    assert AuditEntry.objects.filter(action="job.kill", object_id=str(job.pk)).count() == 1
    exit_all(tasks, code=143, stopped_by="sigterm")
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.stop_reason == "TIME_LIMIT"


def test_node_lost_requeues_the_gang_once(org, ann, nodes):
    job = placed(org, ann, replicas=2, gpus_per_replica=8)
    run_all(job)
    node = Task.objects.get(job=job, rank=0).node
    assert [j.pk for j in node_mark_lost(node=node, reason="missed heartbeats")] == [job.pk]
    assert node_mark_lost(node=node, reason="missed heartbeats") == []
    job.refresh_from_db()
    # Rank 1 runs on a live node: it is told to stop and keeps its GPUs until its agent says it ended.
    survivor = Task.objects.get(job=job, rank=1)
    assert (job.state, job.attempt, job.stop_reason, survivor.state) == (JobState.RUNNING, 1, "NODE_LOST", TaskState.STOPPING)
    assert Allocation.objects.filter(task=survivor, released_at__isnull=True).count() == 8
    assert invariant_violations() == []
    task_mark_exited(task=survivor, exit_code=None, signal=15, stopped_by="sigterm", ended_at=timezone.now())
    job.refresh_from_db()
    assert (job.state, job.attempt) == (JobState.PENDING, 2)
    assert not Allocation.objects.filter(job=job, released_at__isnull=True).exists()
    assert invariant_violations() == []


def test_cancel_of_a_pending_job_is_immediate(org, ann, nodes):
    job = job_submit(user=ann, spec=spec(org))  # no cycle has run: still pending
    job = job_cancel(job=job, actor=ann)
    assert job.state == JobState.CANCELLED
    assert AuditEntry.objects.filter(action="job.cancel", object_id=str(job.pk)).count() == 1


def test_stop_order_tells_started_and_not_yet_started_ranks_to_stop(org, ann, nodes):
    job = placed(org, ann, replicas=2, gpus_per_replica=8)
    first = Task.objects.get(job=job, rank=0)
    task_mark_running(task=first, pid=1, started_at=timezone.now())
    job = job_request_stop(job=job, reason="PREEMPTED", grace_s=30, actor_label="scheduler", note="reclaimed for job 9")
    assert job.state == JobState.PREEMPTING
    assert set(Task.objects.filter(job=job).values_list("state", flat=True)) == {TaskState.STOPPING}
    assert "reclaimed for job 9" in job.events.last().reason
    assert Allocation.objects.filter(job=job, released_at__isnull=True).count() == 16


def test_quota_usage_counts_live_gpus_and_those_running_beyond_the_guarantee(org, ann, nodes):
    from scheduling.selectors import team_quota_usage

    placed(org, ann, replicas=3, gpus_per_replica=8)  # 24 GPUs; team_a guarantees 16, so the plan marks it borrowed
    # Borrowed is what it holds beyond the guarantee; the whole gang is reclaimable, as it is reclaimed whole.
    assert team_quota_usage(team=org.team_a) == {
        "H100": {"guaranteed": 16, "limit": 32, "used": 24, "borrowed": 8, "reclaimable": 24}
    }
