"""Sending: e-mail to a real SMTP server and signed webhook calls to a real HTTP server, both on loopback;
retries with backoff, a failing webhook visible to its owner and switched off, one send per notification."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from notifications.channels import SIGNATURE_HEADER
from notifications.kinds import Channel, Kind
from notifications.models import DeliveryState, Notification, Webhook
from notifications.services import notification_deliver, notifications_collect
from scheduling.services import job_transition
from scheduling.states import JobState
from tenants.models import Role
from tests.factories import make_job, make_org, make_user
from tests.sso.conftest import free_port

pytestmark = pytest.mark.django_db


@pytest.fixture
def failed_job(db: Any) -> Any:
    org = make_org()
    notifications_collect(now=timezone.now())
    owner = make_user("nora", unit=org.team_a)
    owner.email = "nora@example.com"
    owner.save()
    job = make_job(team=org.team_a, user=owner, state=JobState.RUNNING, name="bert")
    return org, owner, job


def _fail(job: Any) -> None:
    job_transition(job=job, to=JobState.FAILED, reason="a rank failed (exit 7)", actor_label="scheduler", exit_code=7)
    notifications_collect(now=timezone.now())


def _deliver_all(channel: str) -> None:
    for n in Notification.objects.filter(channel=channel, state=DeliveryState.PENDING):
        notification_deliver(notification_id=n.pk, now=timezone.now())


def test_a_failure_is_mailed_to_the_owner_through_smtp(failed_job, smtp):
    _, _, job = failed_job
    _fail(job)
    _deliver_all(Channel.EMAIL)
    assert smtp.subjects() == [f"[Yardmaster] Job #{job.pk} bert failed (exit code 7)"]
    message = smtp.messages[0]
    assert message["To"] == "nora@example.com" and message["X-Yardmaster-Event"] == Kind.JOB_FAILED
    assert f"http://127.0.0.1:8000/jobs/{job.pk}/" in message.get_payload()
    assert Notification.objects.get(channel=Channel.EMAIL).state == DeliveryState.SENT


def test_a_webhook_call_is_signed_with_hmac_sha256_and_carries_slack_style_text(failed_job, hooks):
    _, owner, job = failed_job
    hook = Webhook.objects.create(
        user=owner, created_by=owner, name="mine", url=f"{hooks.url}/in", secret="whsec_x", kinds=[Kind.JOB_FAILED]
    )
    _fail(job)
    _deliver_all(Channel.WEBHOOK)
    assert hooks.count() == 1
    call = hooks.calls[0]
    expected = "sha256=" + hmac.new(b"whsec_x", call.body, hashlib.sha256).hexdigest()
    assert call.path == "/in" and call.headers[SIGNATURE_HEADER.lower()] == expected
    body = call.json()
    assert body["text"].startswith(f"*Job #{job.pk} bert failed (exit code 7)*")
    assert body["yardmaster"]["event"] == Kind.JOB_FAILED and body["yardmaster"]["data"]["exit_code"] == 7
    hook.refresh_from_db()
    assert hook.last_success_at is not None and hook.consecutive_failures == 0


def test_a_notification_is_sent_once_however_often_its_task_runs(failed_job, hooks):
    _, owner, job = failed_job
    Webhook.objects.create(user=owner, created_by=owner, name="mine", url=hooks.url, secret="s", kinds=[Kind.JOB_FAILED])
    _fail(job)
    pk = Notification.objects.get(channel=Channel.WEBHOOK).pk
    assert notification_deliver(notification_id=pk, now=timezone.now()) is None
    assert notification_deliver(notification_id=pk, now=timezone.now()) is None
    assert hooks.count() == 1


def test_an_unreachable_smtp_server_is_retried_with_growing_backoff_then_given_up(failed_job, settings):
    _, _, job = failed_job
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", free_port()  # nothing listens
    settings.YARD_NOTIFY = {**settings.YARD_NOTIFY, "MAX_ATTEMPTS": 3, "RETRY_BASE_S": 10.0}
    _fail(job)
    n = Notification.objects.get(channel=Channel.EMAIL)
    delays = []
    for _ in range(3):
        n.refresh_from_db()
        delays.append(notification_deliver(notification_id=n.pk, now=n.next_attempt_at))
    n.refresh_from_db()
    assert delays == [10.0, 40.0, None]
    assert n.state == DeliveryState.FAILED and n.attempts == 3 and "ConnectionRefusedError" in n.last_error


def test_a_retry_is_not_sent_before_its_time(failed_job, hooks, settings):
    _, owner, job = failed_job
    settings.YARD_NOTIFY = {**settings.YARD_NOTIFY, "RETRY_BASE_S": 30.0}
    Webhook.objects.create(user=owner, created_by=owner, name="mine", url=hooks.url, secret="s", kinds=[Kind.JOB_FAILED])
    hooks.status = 503
    _fail(job)
    n = Notification.objects.get(channel=Channel.WEBHOOK)
    assert notification_deliver(notification_id=n.pk, now=timezone.now()) is not None
    assert notification_deliver(notification_id=n.pk, now=timezone.now()) is None  # early: not claimed
    assert hooks.count() == 1


def test_a_webhook_that_keeps_failing_is_switched_off_and_its_owners_are_told(failed_job, hooks, client):
    org, owner, _ = failed_job
    lead = make_user("lea", unit=org.team_a, role=Role.TEAM_LEAD)
    hook = Webhook.objects.create(
        team=org.team_a, created_by=lead, name="team-alerts", url=hooks.url, secret="s", kinds=[Kind.JOB_FAILED]
    )
    hooks.status = 500
    for i in range(4):  # WEBHOOK_DISABLE_AFTER is 3 in these tests
        job = make_job(team=org.team_a, user=owner, state=JobState.RUNNING, name=f"j{i}")
        job_transition(job=job, to=JobState.FAILED, reason="failed", actor_label="scheduler", exit_code=1)
    notifications_collect(now=timezone.now())
    for n in Notification.objects.filter(channel=Channel.WEBHOOK).order_by("pk")[:3]:
        notification_deliver(notification_id=n.pk, now=timezone.now())
    hook.refresh_from_db()
    assert not hook.active and hook.consecutive_failures == 3 and "HTTP 500" in hook.last_error
    assert hooks.count() == 3
    assert set(Notification.objects.filter(channel=Channel.WEBHOOK).values_list("state", flat=True)) == {DeliveryState.FAILED}
    told = Notification.objects.filter(event__kind=Kind.WEBHOOK_DISABLED, channel=Channel.PORTAL)
    assert list(told.values_list("user__username", flat=True)) == ["lea"]

    client.force_login(lead)
    page = client.get("/notifications/webhooks/")
    assert b"disabled" in page.content and b"HTTP 500" in page.content and b"3 failed deliveries in a row" in page.content
    client.post(f"/notifications/webhooks/{hook.pk}/enable/")
    hook.refresh_from_db()
    assert hook.active and hook.consecutive_failures == 0


def test_lost_delivery_tasks_are_queued_again_by_the_next_collect(failed_job, hooks, settings):
    _, owner, job = failed_job
    Webhook.objects.create(user=owner, created_by=owner, name="mine", url=hooks.url, secret="s", kinds=[Kind.JOB_FAILED])
    _fail(job)
    n = Notification.objects.get(channel=Channel.WEBHOOK)
    Notification.objects.filter(pk=n.pk).update(next_attempt_at=timezone.now() - timedelta(minutes=5))
    settings.CELERY_TASK_ALWAYS_EAGER = True  # only to see the re-queue here; real workers: test_workers.py
    from portal.celery import app

    app.conf.task_always_eager = True
    try:
        notifications_collect(now=timezone.now())
    finally:
        app.conf.task_always_eager = False
    n.refresh_from_db()
    assert n.state == DeliveryState.SENT and hooks.count() == 1
