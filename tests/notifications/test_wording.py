"""The words of notifications, as people read them: no "None", no unchanged fields, no repetition, "GPUs"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.utils import timezone

from notifications.kinds import Kind
from notifications.models import Event, Notification
from notifications.services import notifications_collect
from scheduling.governance.reaper import reap_idle_notebooks
from scheduling.models import JobKind
from scheduling.services import job_transition
from scheduling.states import JobState
from tenants.models import Role
from tenants.services import quota_set
from tests.factories import make_cluster, make_job, make_org, make_user
from tests.governance.helpers import MINUTE, running_job, telemetry

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> Any:
    org = make_org()
    notifications_collect(now=timezone.now())
    node = make_cluster(nodes=2)[0]
    return org, node, make_user("nora", unit=org.team_a)


def _body(kind: str) -> str:
    return Event.objects.filter(kind=kind).latest("pk").body


def test_a_new_limit_says_no_limit_and_unchanged_fields_are_not_listed(world):
    org, _, _ = world
    oli = make_user("oli", unit=org.bu, role=Role.ORG_ADMIN)
    quota_set(actor=oli, unit=org.team_a, gpu_type="A100", guaranteed=0)  # a new quota: no limit
    quota_set(actor=oli, unit=org.team_a, gpu_type="A100", guaranteed=0, limit=16)
    notifications_collect(now=timezone.now())
    bodies = list(
        Event.objects.filter(kind=Kind.QUOTA_CHANGED, data__gpu_type="A100").order_by("pk").values_list("body", flat=True)
    )
    assert bodies[0] == "team-a A100: new quota: guaranteed 0, no limit, weight 1 (by oli)."
    assert bodies[1] == "team-a A100: limit no limit → 16 (by oli)."
    assert all("None" not in b and "1.0 → 1.0" not in b and "guaranteed 0 → 0" not in b for b in bodies)


def test_a_completed_job_does_not_say_every_rank_exited_0_twice(world):
    org, _, nora = world
    job = make_job(team=org.team_a, user=nora, state=JobState.STARTING, name="bert")
    job = job_transition(job=job, to=JobState.RUNNING, reason="all 1 ranks running", actor_label="scheduler")
    job_transition(job=job, to=JobState.COMPLETED, reason="every rank exited 0", actor_label="scheduler", exit_code=0)
    notifications_collect(now=timezone.now())
    assert _body(Kind.JOB_COMPLETED) == "Every rank exited 0."


def test_the_idle_warning_keeps_gpus_in_capitals(world):
    org, node, nora = world
    t0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)
    notebook = running_job(team=org.team_a, user=nora, node=node, gpus=1, start=t0, kind=JobKind.NOTEBOOK, name="lab")
    telemetry(notebook, start=t0, minutes=46, utilization=0)
    reap_idle_notebooks(now=t0 + 36 * MINUTE + timedelta(seconds=7))
    notifications_collect(now=t0 + 37 * MINUTE)
    body = _body(Kind.IDLE_WARNING)
    assert body.startswith("Its GPUs are unused") and "gpus" not in body
    assert ".." not in body


def test_the_demo_seed_makes_no_quota_change_notifications():
    call_command("seed_demo", "--no-history", stdout=StringIO())
    notifications_collect(now=timezone.now() + timedelta(hours=1))
    assert not Event.objects.filter(kind=Kind.QUOTA_CHANGED).exists()
    assert not Notification.objects.exists()
