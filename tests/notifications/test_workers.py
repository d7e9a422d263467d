"""Exactly one e-mail and one webhook call per event with two real Celery workers collecting and
delivering at once (separate `celery -A portal worker` processes on the test database and Redis)."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from notifications.kinds import Channel, Kind
from notifications.models import DeliveryState, Notification, Webhook
from notifications.services import notifications_collect
from notifications.tasks import collect
from portal.celery import app
from scheduling.services import job_transition
from scheduling.states import JobState
from tests.cycle.workers import Worker
from tests.e2e.conftest import wait_for
from tests.factories import make_job, make_org, make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
JOBS = 30
COLLECTS = 8


def _succeeded(workers: list[Worker], task: str) -> int:
    """Tasks of this name the workers logged as finished (Celery's "Task NAME[id] succeeded in …")."""
    return sum(
        sum(1 for line in w.log_path.read_text().splitlines() if f"Task {task}[" in line and "succeeded" in line) for w in workers
    )


def test_two_workers_send_each_notification_exactly_once(transactional_db: Any, smtp: Any, hooks: Any, tmp_path: Any) -> None:
    org = make_org()
    notifications_collect(now=timezone.now())
    owner = make_user("nora", unit=org.team_a)
    owner.email = "nora@example.com"
    owner.save()
    Webhook.objects.create(team=org.team_a, created_by=owner, name="team", url=hooks.url, secret="s", kinds=[Kind.JOB_FAILED])
    app.control.purge()
    env = {
        "EMAIL_HOST": smtp.host,
        "EMAIL_PORT": str(smtp.port),
        "YARD_WEBHOOK_DENY_NETWORKS": "",
        "YARD_NOTIFY_RETRY_BASE_S": "0.5",
    }
    workers = [Worker(f"n{i}", tmp_path, **env) for i in (1, 2)]
    try:
        for w in workers:
            w.wait_ready()
        for i in range(JOBS):
            job = make_job(team=org.team_a, user=owner, state=JobState.RUNNING, name=f"j{i}")
            job_transition(
                job=job, to=JobState.FAILED, reason=f"a rank failed (exit {i + 1})", actor_label="scheduler", exit_code=i + 1
            )
        for _ in range(COLLECTS):
            collect.delay()
        wait_for(
            f"{JOBS} e-mails and {JOBS} webhook calls",
            lambda: len(smtp.subjects()) >= JOBS and hooks.count() >= JOBS,
            timeout=120,
        )
        wait_for(
            f"all {COLLECTS} collect tasks to finish",
            lambda: _succeeded(workers, "notifications.tasks.collect") >= COLLECTS,
            timeout=60,
        )
        wait_for(
            "every delivery settled",
            lambda: not Notification.objects.exclude(channel=Channel.PORTAL).exclude(state=DeliveryState.SENT).exists(),
            timeout=60,
        )
    finally:
        for w in workers:
            w.stop()
    mail_ids = [m["X-Yardmaster-Delivery"] for m in smtp.messages]
    hook_ids = [c.headers["x-yardmaster-delivery"] for c in hooks.calls]
    assert len(mail_ids) == len(set(mail_ids)) == JOBS
    assert len(hook_ids) == len(set(hook_ids)) == JOBS
    assert Notification.objects.filter(channel=Channel.PORTAL, user=owner).count() == JOBS
    for w in workers:  # both took part
        assert "notifications.tasks" in w.log_path.read_text(), w.log_path.read_text()[-2000:]
