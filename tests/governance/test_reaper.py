"""The idle-notebook reaper on a controlled clock with simulated telemetry (GpuWindow rows made directly)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import connection

from scheduling.governance.reaper import (
    FLAG_ACTION,
    idle_seconds,
    idle_warnings_for,
    notebook_extend_idle,
    policy_for,
    reap_idle_notebooks,
)
from scheduling.models import IdlePolicy, Job, JobEvent, JobKind, Task
from scheduling.states import TaskState
from tenants.models import AuditEntry, Role
from tests.factories import make_cluster, make_org, make_user
from tests.governance.helpers import MINUTE, running_job, telemetry

T0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)
pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    org = make_org()
    node = make_cluster(nodes=1)[0]
    owner = make_user("nora", unit=org.team_a)
    return org, node, owner


def _notebook(world, *, gpus: int = 2, **fields):
    org, node, owner = world
    return running_job(team=org.team_a, user=owner, node=node, gpus=gpus, start=T0, kind=JobKind.NOTEBOOK, **fields)


def _after(minutes: int) -> datetime:
    """A moment a few seconds into the minute after ``minutes`` whole windows have ended."""
    return T0 + minutes * MINUTE + timedelta(seconds=7)


def _warned(job, *, minutes: int = 35) -> None:
    """The pass that warns (by default at 35 idle minutes: the default 45 min timeout less its 10 min
    lead): the reaper stops a notebook only once a warning has stood for the whole lead."""
    assert reap_idle_notebooks(now=_after(minutes)).warned == [job.pk]


def test_notebook_idle_for_44_minutes_is_kept(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=44, utilization=0)
    report = reap_idle_notebooks(now=_after(44))
    job.refresh_from_db()
    assert report.reaped == [] and job.stop_requested_at is None


def test_notebook_idle_for_45_minutes_plus_one_window_is_stopped_with_idle_timeout(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=46, utilization=0)
    _warned(job)
    report = reap_idle_notebooks(now=_after(46))
    job.refresh_from_db()
    assert report.reaped == [job.pk]
    assert job.stop_reason == "IDLE_TIMEOUT" and job.stop_requested_at is not None
    assert set(Task.objects.filter(job=job).values_list("state", flat=True)) == {TaskState.STOPPING}


def test_utilisation_under_the_threshold_counts_as_idle(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=46, utilization=0.5)
    _warned(job)
    assert reap_idle_notebooks(now=_after(46)).reaped == [job.pk]


def test_busy_kernel_with_no_browser_open_is_kept(world):
    job = _notebook(world)
    Task.objects.filter(job=job).update(notebook_last_activity=T0, notebook_kernel_busy=None)
    telemetry(job, start=T0, minutes=180, utilization=85)
    report = reap_idle_notebooks(now=_after(180))
    job.refresh_from_db()
    assert report.reaped == [] and report.warned == [] and job.stop_requested_at is None


def test_idle_gpus_are_reaped_however_often_the_page_is_opened(world):
    job = _notebook(world)
    Task.objects.filter(job=job).update(notebook_last_activity=_after(46), notebook_kernel_busy=False)
    telemetry(job, start=T0, minutes=46, utilization=0)
    _warned(job)
    assert reap_idle_notebooks(now=_after(46)).reaped == [job.pk]


def test_one_busy_gpu_keeps_the_notebook(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=46, utilization=0)
    from scheduling.models import GpuWindow

    one = GpuWindow.objects.filter(start=T0 + 40 * MINUTE).first()
    GpuWindow.objects.filter(pk=one.pk).update(utilization_max=60, utilization_sum=360)
    assert reap_idle_notebooks(now=_after(46)).reaped == []


def test_a_window_without_samples_is_not_idle_evidence(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=46, utilization=0)
    from scheduling.models import GpuWindow

    GpuWindow.objects.filter(start=T0 + 20 * MINUTE).delete()  # the agent was silent for a minute
    GpuWindow.objects.filter(start=T0 + 30 * MINUTE).update(samples=0)
    # The two unknown minutes neither count towards the timeout nor end the spell.
    assert idle_seconds(job=job, now=_after(46), threshold_pct=1, cap_s=3600) == 44 * 60
    _warned(job, minutes=37)  # 35 idle minutes observed by then
    assert reap_idle_notebooks(now=_after(46)).reaped == []  # 44 idle minutes: one to go
    assert reap_idle_notebooks(now=_after(47)).reaped == []  # its window has not come yet
    telemetry(job, start=T0 + 46 * MINUTE, minutes=1, utilization=0)
    assert reap_idle_notebooks(now=_after(47)).reaped == [job.pk]


def test_warning_comes_at_the_lead_time_not_before(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=35, utilization=0)
    assert reap_idle_notebooks(now=_after(34)).warned == []  # 34 min idle: 11 min to go, lead is 10
    report = reap_idle_notebooks(now=_after(35))
    job.refresh_from_db()
    assert report.warned == [job.pk] and job.idle_warned_at == _after(35)
    assert JobEvent.objects.filter(job=job, reason__startswith="idle warning").count() == 1


def test_warning_is_given_once(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=40, utilization=0)
    reap_idle_notebooks(now=_after(36))
    assert reap_idle_notebooks(now=_after(40)).warned == []
    assert JobEvent.objects.filter(job=job, reason__startswith="idle warning").count() == 1


def test_warning_is_withdrawn_when_the_gpus_are_used_again(world):
    job = _notebook(world)
    telemetry(job, start=T0, minutes=36, utilization=0)
    reap_idle_notebooks(now=_after(36))
    from scheduling.models import GpuWindow

    for gpu_id in set(GpuWindow.objects.values_list("gpu_id", flat=True)):
        GpuWindow.objects.create(gpu_id=gpu_id, start=T0 + 36 * MINUTE, samples=6, utilization_sum=480, utilization_max=80)
    report = reap_idle_notebooks(now=_after(37))
    job.refresh_from_db()
    assert report.cleared == [job.pk] and job.idle_warned_at is None


def test_warned_notebook_shows_in_its_owners_banner_only(world):
    org, _, owner = world
    job = _notebook(world)
    telemetry(job, start=T0, minutes=36, utilization=0)
    reap_idle_notebooks(now=_after(36))
    warnings = idle_warnings_for(owner)
    assert [w.job.pk for w in warnings] == [job.pk] and warnings[0].can_extend
    assert idle_warnings_for(make_user("someone", unit=org.team_a)) == []


def test_owner_extension_postpones_the_stop(world):
    _, _, owner = world
    job = _notebook(world)
    telemetry(job, start=T0, minutes=120, utilization=0)
    reap_idle_notebooks(now=_after(36))
    notebook_extend_idle(job=job, user=owner, now=_after(40))
    assert reap_idle_notebooks(now=_after(60)).reaped == []  # 40 + 60 min extension not yet over
    # The extension ended the warning: its end is warned about again, the lead before it.
    assert reap_idle_notebooks(now=_after(90)).warned == [job.pk]
    assert reap_idle_notebooks(now=_after(100)).reaped == [job.pk]


def test_second_extension_is_refused(world):
    _, _, owner = world
    job = _notebook(world)
    notebook_extend_idle(job=job, user=owner, now=_after(40))
    job.refresh_from_db()
    with pytest.raises(ValidationError, match="already extended"):
        notebook_extend_idle(job=job, user=owner, now=_after(41))


def test_extension_refused_when_policy_forbids_it(world):
    org, _, owner = world
    IdlePolicy.objects.create(unit=org.dept, tier=None, allow_extend=False)
    job = _notebook(world)
    with pytest.raises(ValidationError, match="does not allow"):
        notebook_extend_idle(job=job, user=owner, now=_after(40))


def test_only_the_owner_may_extend(world):
    org, _, _ = world
    job = _notebook(world)
    lead = make_user("lead", unit=org.team_a, role=Role.TEAM_LEAD)
    with pytest.raises(PermissionDenied):
        notebook_extend_idle(job=job, user=lead, now=_after(40))


def test_batch_job_idle_for_hours_is_never_stopped(world):
    org, node, owner = world
    job = running_job(team=org.team_a, user=owner, node=node, gpus=2, start=T0)
    telemetry(job, start=T0, minutes=6 * 60, utilization=0)
    report = reap_idle_notebooks(now=_after(6 * 60))
    job.refresh_from_db()
    assert report.reaped == [] and job.stop_requested_at is None


def test_idle_batch_job_is_flagged_to_its_team_lead_once(world):
    org, node, owner = world
    make_user("lead", unit=org.team_a, role=Role.TEAM_LEAD)
    IdlePolicy.objects.create(unit=org.team_a, tier=None, flag_idle_batch_after_s=2 * 3600)
    job = running_job(team=org.team_a, user=owner, node=node, gpus=2, start=T0)
    telemetry(job, start=T0, minutes=3 * 60, utilization=0)
    assert reap_idle_notebooks(now=_after(119)).flagged == []
    assert reap_idle_notebooks(now=_after(120)).flagged == [job.pk]
    assert reap_idle_notebooks(now=_after(150)).flagged == []
    entry = AuditEntry.objects.get(action=FLAG_ACTION)
    assert entry.data["team_leads"] == ["lead"] and entry.unit == org.team_a
    job.refresh_from_db()
    assert job.stop_requested_at is None


def test_team_policy_timeout_beats_the_default(world):
    org, _, _ = world
    IdlePolicy.objects.create(unit=org.team_a, tier=None, timeout_s=20 * 60)
    job = _notebook(world)
    telemetry(job, start=T0, minutes=21, utilization=0)
    _warned(job, minutes=10)
    assert reap_idle_notebooks(now=_after(21)).reaped == [job.pk]


def test_nearest_unit_policy_wins(world):
    org, _, _ = world
    IdlePolicy.objects.create(unit=org.bu, tier=2, timeout_s=10 * 60)
    IdlePolicy.objects.create(unit=org.dept, tier=None, timeout_s=30 * 60)
    assert policy_for(team=org.team_a, tier=2).timeout_s == 30 * 60


def test_tier_specific_policy_beats_tier_less_at_the_same_unit(world):
    org, _, _ = world
    IdlePolicy.objects.create(unit=org.dept, tier=None, timeout_s=30 * 60)
    IdlePolicy.objects.create(unit=org.dept, tier=3, timeout_s=15 * 60)
    assert (policy_for(team=org.team_a, tier=3).timeout_s, policy_for(team=org.team_a, tier=2).timeout_s) == (900, 1800)


def test_default_timeout_comes_from_settings(world, settings):
    org, _, _ = world
    settings.YARD = {**settings.YARD, "IDLE_NOTEBOOK_TIMEOUT_S": 300.0}
    assert policy_for(team=org.team_a, tier=2).timeout_s == 300.0


def test_celery_task_runs_a_pass_with_the_current_time(world):
    from scheduling.governance.tasks import reap_idle_notebooks as task

    assert task.run() == {"warned": [], "reaped": [], "flagged": [], "cleared": []}


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_reapers_issue_one_stop():
    org = make_org()
    node = make_cluster(nodes=1)[0]
    owner = make_user("nora", unit=org.team_a)
    job = running_job(team=org.team_a, user=owner, node=node, gpus=2, start=T0, kind=JobKind.NOTEBOOK)
    telemetry(job, start=T0, minutes=46, utilization=0)
    _warned(job)
    barrier = threading.Barrier(2)
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def reaper() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(reap_idle_notebooks(now=_after(46)).reaped)
        except BaseException as exc:  # surfaced below: a thread's exception would be lost otherwise
            errors.append(exc)
        finally:
            connection.close()  # each thread has its own connection (Django's are per thread)

    threads = [threading.Thread(target=reaper) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert sorted(len(r) for r in results) == [0, 1]
    assert JobEvent.objects.filter(job=job, reason__startswith="stop ordered (IDLE_TIMEOUT").count() == 1
    assert Job.objects.get(pk=job.pk).stop_reason == "IDLE_TIMEOUT"


def test_reaped_notebook_ends_cancelled_with_idle_timeout_and_is_accounted(world):
    from scheduling.governance.accounting import job_usage, month_of
    from scheduling.services import task_mark_exited

    job = _notebook(world)
    telemetry(job, start=T0, minutes=46, utilization=0)
    _warned(job)
    reap_idle_notebooks(now=_after(46))
    for task in Task.objects.filter(job=job):
        task_mark_exited(task=task, exit_code=None, signal=15, stopped_by="sigterm", ended_at=_after(47))
    job.refresh_from_db()
    assert (job.state, job.stop_reason) == ("CANCELLED", "IDLE_TIMEOUT")
    [row] = job_usage(month=month_of(T0), now=_after(47))
    assert row.usage.reaped_s == row.usage.used_s > 0


def test_idle_banner_offers_the_owner_an_extension(world, rf):
    from django.template.loader import render_to_string

    _, _, owner = world
    job = _notebook(world)
    telemetry(job, start=T0, minutes=36, utilization=0)
    reap_idle_notebooks(now=_after(36))
    request = rf.get("/jobs/")
    request.user = owner
    html = render_to_string("governance/_idle_banner.html", {"idle_warnings": idle_warnings_for(owner)}, request=request)
    assert f"/notebooks/{job.pk}/extend-idle" in html and "Keep it 60 min longer" in html


def test_idle_banner_is_empty_without_warnings(rf):
    from django.template.loader import render_to_string

    assert render_to_string("governance/_idle_banner.html", {"idle_warnings": []}, request=rf.get("/")).strip() == ""
