"""Notifications derived from what the services, the agents' reports and the reaper record, on PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from notifications.kinds import Channel, Kind
from notifications.models import Event, Notification, Watermark, Webhook
from notifications.services import SETTLE_S, notifications_collect, preferences_set
from scheduling.governance.reaper import reap_idle_notebooks
from scheduling.models import JobKind, Task
from scheduling.services import job_request_stop, job_transition, task_mark_exited
from scheduling.states import JobState
from tenants.models import Role
from tenants.services import quota_set, token_create_service
from tests.factories import make_cluster, make_job, make_org, make_user
from tests.governance.helpers import MINUTE, running_job, telemetry

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> Any:
    org = make_org()
    notifications_collect(now=timezone.now())  # the org's own quota.create rows, before anyone is a member
    node = make_cluster(nodes=2)[0]
    owner = make_user("nora", unit=org.team_a)
    owner.email = "nora@example.com"
    owner.save()
    return org, node, owner


def _collect(now: datetime | None = None) -> Any:
    return notifications_collect(now=now or timezone.now())


def _portal(user: Any) -> list[tuple[str, str]]:
    return list(
        Notification.objects.filter(user=user, channel=Channel.PORTAL).order_by("pk").values_list("event__kind", "event__title")
    )


def _running(world: Any, **fields: Any) -> Any:
    org, node, owner = world
    return running_job(team=org.team_a, user=owner, node=node, gpus=1, start=timezone.now() - timedelta(minutes=5), **fields)


def test_start_and_completion_each_make_one_portal_notification_for_the_owner(world):
    org, _, owner = world
    job = make_job(team=org.team_a, user=owner, state=JobState.STARTING, name="bert")
    job = job_transition(job=job, to=JobState.RUNNING, reason="all 1 ranks running", actor_label="scheduler")
    job_transition(job=job, to=JobState.COMPLETED, reason="every rank exited 0", actor_label="scheduler", exit_code=0)
    _collect()
    assert _portal(owner) == [
        (Kind.JOB_STARTED, f"Job #{job.pk} bert started"),
        (Kind.JOB_COMPLETED, f"Job #{job.pk} bert completed"),
    ]


def test_a_failed_job_says_its_exit_code(world):
    _, _, owner = world
    job = _running(world, name="gpt")
    task = Task.objects.get(job=job)
    task_mark_exited(task=task, exit_code=3, signal=None, stopped_by="", ended_at=timezone.now())
    _collect()
    event = Event.objects.get(kind=Kind.JOB_FAILED)
    assert event.title == f"Job #{job.pk} gpt failed (exit code 3)" and event.data["exit_code"] == 3
    assert _portal(owner) == [(Kind.JOB_FAILED, event.title)]


def test_a_preempted_and_requeued_job_makes_one_notification(world):
    _, _, owner = world
    job = _running(world, name="vit")
    job_request_stop(job=job, reason="PREEMPTED", actor_label="scheduler")
    task_mark_exited(task=Task.objects.get(job=job), exit_code=143, signal=None, stopped_by="sigterm", ended_at=timezone.now())
    _collect()
    assert [k for k, _ in _portal(owner)] == [Kind.JOB_PREEMPTED]
    assert "requeued as attempt 2" in Event.objects.get(kind=Kind.JOB_PREEMPTED).body


def test_the_idle_reapers_warning_and_stop_are_notified(world):
    org, node, owner = world
    t0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)
    notebook = running_job(team=org.team_a, user=owner, node=node, gpus=1, start=t0, kind=JobKind.NOTEBOOK, name="lab")
    telemetry(notebook, start=t0, minutes=46, utilization=0)
    reap_idle_notebooks(now=t0 + 36 * MINUTE + timedelta(seconds=7))  # within the 10-minute warning lead
    reap_idle_notebooks(now=t0 + 46 * MINUTE + timedelta(seconds=7))
    _collect()
    assert [k for k, _ in _portal(owner)] == [Kind.IDLE_WARNING, Kind.IDLE_STOPPED]
    assert Event.objects.get(kind=Kind.IDLE_WARNING).title == f"Notebook #{notebook.pk} lab is idle and will be stopped"


def test_a_job_near_its_time_limit_is_notified_once_per_attempt(world, settings):
    _, _, owner = world
    settings.YARD_NOTIFY = {**settings.YARD_NOTIFY, "TIME_LIMIT_LEAD_S": 1800.0}
    now = timezone.now()
    job = _running(world, name="long", time_limit_s=7200)
    job.started_at = now - timedelta(seconds=7200 - 1700)  # 28 min left
    job.save(update_fields=["started_at"])
    far = _running(world, name="fresh", time_limit_s=7200)  # 115 min left: not yet
    _collect(now)
    _collect(now + timedelta(minutes=1))
    assert Event.objects.filter(kind=Kind.JOB_NEAR_LIMIT).count() == 1
    assert Event.objects.get(kind=Kind.JOB_NEAR_LIMIT).job_id == job.pk != far.pk
    job.attempt, job.started_at = 2, now - timedelta(seconds=7200 - 600)
    job.save(update_fields=["attempt", "started_at"])
    _collect(now)
    assert list(Event.objects.filter(kind=Kind.JOB_NEAR_LIMIT).values_list("key", flat=True).order_by("key")) == [
        f"near-limit:{job.pk}:1", f"near-limit:{job.pk}:2",
    ]  # fmt: skip
    assert len(_portal(owner)) == 2


def test_a_quota_change_reaches_the_members_of_every_team_under_the_unit_but_not_its_author(world):
    org, _, nora = world
    ben = make_user("ben", unit=org.team_b)
    zed = make_user("zed", unit=org.team_c)
    oli = make_user("oli", unit=org.bu, role=Role.ORG_ADMIN)
    lea = make_user("lea", unit=org.team_a, role=Role.TEAM_LEAD)
    quota_set(actor=oli, unit=org.team_a, gpu_type="H100", guaranteed=12, limit=32)
    _collect()
    assert [k for k, _ in _portal(nora)] == [Kind.QUOTA_CHANGED] == [k for k, _ in _portal(lea)]
    assert _portal(ben) == [] and _portal(zed) == [] and _portal(oli) == []
    assert "guaranteed 16 → 12" in Event.objects.get(kind=Kind.QUOTA_CHANGED, data__action="quota.update").body
    quota_set(actor=oli, unit=org.dept, gpu_type="H100", guaranteed=30)  # the department: both its teams
    _collect()
    assert len(_portal(ben)) == 1 and len(_portal(nora)) == 2 and _portal(zed) == []


def test_collecting_again_makes_nothing_new_and_the_watermark_moves_past_old_rows(world):
    org, _, owner = world
    job = make_job(team=org.team_a, user=owner, state=JobState.STARTING)
    job_transition(job=job, to=JobState.RUNNING, reason="running", actor_label="scheduler")
    later = timezone.now() + timedelta(seconds=SETTLE_S + 1)
    _collect()
    _collect()
    _collect(later)
    assert Notification.objects.count() == 1 and Event.objects.filter(job=job).count() == 1
    assert Watermark.objects.get(name="jobevent").last_id == job.events.order_by("-pk").first().pk


def test_the_owners_choices_decide_the_channels(world, smtp):
    org, _, owner = world
    preferences_set(user=owner, choices={(Kind.JOB_STARTED, Channel.PORTAL): False, (Kind.JOB_STARTED, Channel.EMAIL): True})
    job = make_job(team=org.team_a, user=owner, state=JobState.STARTING)
    job = job_transition(job=job, to=JobState.RUNNING, reason="running", actor_label="scheduler")
    job_transition(job=job, to=JobState.COMPLETED, reason="done", actor_label="scheduler", exit_code=0)
    _collect()
    got = set(Notification.objects.values_list("event__kind", "channel"))
    # started: e-mail only (chosen); completed: the defaults (portal, no e-mail)
    assert got == {(Kind.JOB_STARTED, Channel.EMAIL), (Kind.JOB_COMPLETED, Channel.PORTAL)}


def test_by_default_a_failure_is_mailed_and_a_completion_is_not(world, smtp):
    org, _, owner = world
    for outcome in (JobState.COMPLETED, JobState.FAILED):
        job = make_job(team=org.team_a, user=owner, state=JobState.RUNNING)
        job_transition(
            job=job, to=outcome, reason="ended", actor_label="scheduler", exit_code=0 if outcome == JobState.COMPLETED else 1
        )
    _collect()
    assert set(Notification.objects.filter(channel=Channel.EMAIL).values_list("event__kind", flat=True)) == {Kind.JOB_FAILED}


def test_a_ci_jobs_events_go_to_the_teams_webhook_not_to_the_service_account(world, hooks):
    org, _, _ = world
    lead = make_user("lea", unit=org.team_a, role=Role.TEAM_LEAD)
    service = token_create_service(actor=lead, team=org.team_a, name="ci", expires_at=None).token.user
    hook = Webhook.objects.create(team=org.team_a, created_by=lead, name="ci", url=hooks.url, secret="s", kinds=[Kind.JOB_FAILED])
    job = make_job(team=org.team_a, user=service, state=JobState.RUNNING)
    job_transition(job=job, to=JobState.FAILED, reason="a rank failed (exit 2)", actor_label="scheduler", exit_code=2)
    _collect()
    assert list(Notification.objects.values_list("channel", "webhook_id", "user_id")) == [(Channel.WEBHOOK, hook.pk, None)]


def test_a_job_array_says_when_it_starts_and_when_all_its_tasks_have_ended_not_per_task(world):
    """Slurm mails an array's BEGIN, END and FAIL for the array as a whole: 4,000 tasks are two notices, not 8,000."""
    from scheduling.models import Job, JobArray

    org, _, owner = world
    tasks = [make_job(team=org.team_a, user=owner, state=JobState.STARTING, name="sweep") for _ in range(3)]
    array = JobArray.objects.create(id=tasks[0].pk, indices="0-2", task_count=3)
    for index, task in enumerate(tasks):
        Job.objects.filter(pk=task.pk).update(array=array, array_index=index)
        task.refresh_from_db()
    first, second, third = tasks
    first = job_transition(job=first, to=JobState.RUNNING, reason="all 1 ranks running", actor_label="scheduler")
    second = job_transition(job=second, to=JobState.RUNNING, reason="all 1 ranks running", actor_label="scheduler")
    job_transition(job=first, to=JobState.COMPLETED, reason="every rank exited 0", actor_label="scheduler", exit_code=0)
    job_transition(job=second, to=JobState.FAILED, reason="rank 0 exited 3", actor_label="scheduler", exit_code=3)
    _collect()
    # Two tasks ran and ended, but the third has not: the array is not over.
    assert _portal(owner) == [(Kind.JOB_STARTED, f"Array #{array.pk} sweep started")]
    job_transition(job=third, to=JobState.CANCELLED, reason="cancelled by nora", actor_label="nora")
    _collect()
    _collect()
    assert _portal(owner) == [
        (Kind.JOB_STARTED, f"Array #{array.pk} sweep started"),
        (Kind.JOB_FAILED, f"Array #{array.pk} sweep: 1 completed, 1 failed, 1 cancelled of 3 tasks"),
    ]
    assert Event.objects.get(kind=Kind.JOB_FAILED).link == f"/jobs/?array={array.pk}"
