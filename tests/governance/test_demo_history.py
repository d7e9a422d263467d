"""seed_demo's month of history: the report, fair share and charts show real shapes on first start."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from itertools import pairwise

import pytest
from django.core.cache import cache
from django.core.management import call_command
from django.utils import timezone

from scheduling.governance.accounting import month_of
from scheduling.governance.fairshare import fairshare_explain
from scheduling.governance.reports import build_report, top_units
from scheduling.models import Allocation, GpuWindow, Job, JobEvent, JobKind
from scheduling.selectors import invariant_violations
from tenants.models import OrgUnit, UnitKind

pytestmark = pytest.mark.django_db


@pytest.fixture
def demo(db):
    call_command("seed_demo", verbosity=0)  # inside the test's transaction: rolled back after it


def test_no_gpu_is_ever_in_two_allocations_and_every_job_has_ended(demo):
    now = timezone.now()
    by_gpu = defaultdict(list)
    for gpu_id, start, end in Allocation.objects.values_list("gpu_id", "allocated_at", "released_at"):
        assert end is not None and end <= now
        by_gpu[gpu_id].append((start, end))
    for intervals in by_gpu.values():
        intervals.sort()
        assert all(a[1] <= b[0] for a, b in pairwise(intervals))
    assert not Job.objects.filter(ended_at__isnull=True).exists()
    assert invariant_violations() == []


def test_the_last_thirty_days_have_the_shapes_the_report_shows(demo):
    now = timezone.now()
    month = month_of(now - timedelta(days=15))
    report = build_report(month=month, tops=top_units(OrgUnit.objects.all()), now=now)
    total = report.total
    assert total.used_gpu_hours > 5_000  # not "10 GPU-hours of 142,848"
    assert total.efficiency is not None and 0.4 < total.efficiency < 0.95
    assert total.borrowed_gpu_hours > 0 and total.lost_gpu_hours > 0
    assert total.borrowed_gpu_hours < total.used_gpu_hours
    teams = {n.unit.name: n.total.used_gpu_hours for n in report.teams()}
    assert len(teams) == 8 and all(hours > 0 for hours in teams.values())
    days_used = {d for series in report.team_daily_s.values() for d, s in series.items() if s > 0}
    assert len(days_used) >= 10  # a chart with a shape, not one bar


def test_a_notebook_was_stopped_by_the_idle_reaper_with_its_idle_minutes(demo):
    reaped = Job.objects.get(kind=JobKind.NOTEBOOK, stop_reason="IDLE_TIMEOUT")
    assert JobEvent.objects.filter(job=reaped, reason__startswith="idle for 45 min").exists()
    gpu_id = Allocation.objects.filter(job=reaped).values_list("gpu_id", flat=True).get()
    idle = GpuWindow.objects.filter(gpu_id=gpu_id, start__gte=reaped.ended_at - timedelta(minutes=46), utilization_max=0)
    assert idle.count() >= 44  # whole minutes inside the allocation: 45 or 46, by where the seconds fall


def test_preempted_jobs_were_requeued_as_a_second_attempt(demo):
    preempted = JobEvent.objects.filter(to_state="PREEMPTED").values_list("job_id", flat=True)
    assert preempted
    assert set(Job.objects.filter(pk__in=preempted).values_list("attempt", flat=True)) == {2}


def test_fair_share_orders_teams_by_real_use(demo):
    cache.clear()
    teams = list(OrgUnit.objects.filter(kind=UnitKind.TEAM))
    standing = fairshare_explain(teams=teams, now=timezone.now())
    assert sorted(t.rank for t in standing.teams) == list(range(1, 9))
    assert all(sum(t.usage_gpu_hours.values()) > 0 for t in standing.teams)


def test_the_history_sends_nobody_a_notification(demo):
    from notifications.services import notifications_collect

    notifications_collect(now=timezone.now())
    from notifications.models import Event

    assert not Event.objects.filter(key__startswith="jobevent:").exists()
