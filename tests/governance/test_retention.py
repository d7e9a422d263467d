"""GPU telemetry is kept YARD_TELEMETRY_KEEP_DAYS days: older windows go, in batches; newer ones and
the GPU-hours of allocations stay."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduling.governance.retention import prune_telemetry
from scheduling.governance.tasks import prune_telemetry as prune_task
from scheduling.models import Gpu, GpuWindow
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db


def windows(gpu: Gpu, *, days_ago: float, count: int) -> None:
    start = (timezone.now() - timedelta(days=days_ago)).replace(second=0, microsecond=0)
    GpuWindow.objects.bulk_create(
        GpuWindow(gpu=gpu, start=start + timedelta(minutes=i), samples=6, utilization_sum=60.0) for i in range(count)
    )


def test_windows_older_than_the_kept_days_are_deleted_in_batches_and_newer_ones_stay(settings):
    settings.YARD = {**settings.YARD, "TELEMETRY_KEEP_DAYS": 30}
    gpu = Gpu.objects.filter(node__in=make_cluster(nodes=1)).first()
    windows(gpu, days_ago=40, count=25)
    windows(gpu, days_ago=29, count=7)
    pruned = prune_telemetry(now=timezone.now(), batch=10)
    assert (pruned.deleted, pruned.done) == (25, True)
    assert GpuWindow.objects.count() == 7
    assert not GpuWindow.objects.filter(start__lt=pruned.before).exists()


def test_a_pass_stops_after_its_batches_and_says_there_is_more(settings):
    settings.YARD = {**settings.YARD, "TELEMETRY_KEEP_DAYS": 30}
    gpu = Gpu.objects.filter(node__in=make_cluster(nodes=1)).first()
    windows(gpu, days_ago=40, count=25)
    pruned = prune_telemetry(now=timezone.now(), batch=10, max_batches=2)
    assert (pruned.deleted, pruned.done) == (20, False)
    assert prune_telemetry(now=timezone.now(), batch=10).deleted == 5


def test_the_beat_runs_it_hourly_with_the_deployments_setting(settings):
    from portal.celery import app

    entry = app.conf.beat_schedule["telemetry-retention"]
    assert (entry["task"], entry["schedule"]) == ("scheduling.governance.tasks.prune_telemetry", 3600.0)
    settings.YARD = {**settings.YARD, "TELEMETRY_KEEP_DAYS": 1}
    gpu = Gpu.objects.filter(node__in=make_cluster(nodes=1)).first()
    windows(gpu, days_ago=2, count=3)
    assert prune_task()["deleted"] == 3
