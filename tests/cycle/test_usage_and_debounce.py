"""Decayed fair-share usage from allocation intervals, and the debounced cycle request."""

import math
from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from portal.celery import app
from scheduling.cycle import run_cycle_once
from scheduling.selectors import decayed_usage
from scheduling.selectors.usage import _decayed
from scheduling.services import JobSpec, job_submit

pytestmark = pytest.mark.django_db


def test_one_gpu_held_for_one_half_life_until_now_counts_half_its_undecayed_integral():
    half_life = 3600.0
    now = timezone.now()
    value = _decayed(now - timedelta(seconds=half_life), now, now, half_life)
    assert value == pytest.approx(0.5 * half_life / math.log(2))


def test_usage_is_per_team_and_gpu_type(org, ann, nodes):
    job_submit(user=ann, spec=JobSpec(name="t", team=org.team_a, replicas=1, gpus_per_replica=8, command="true"))
    run_cycle_once()
    later = timezone.now() + timedelta(seconds=100)
    cache.clear()  # the figure is cached for a few seconds; the submit above computed it before the placement
    usage = decayed_usage(now=later)
    assert set(usage) == {org.team_a.pk}
    assert usage[org.team_a.pk]["H100"] == pytest.approx(800, rel=0.05)


def _queued() -> int:
    return redis.Redis.from_url(settings.REDIS_URL).llen("celery")


def test_a_burst_of_submits_requests_one_cycle(org, ann, nodes, django_capture_on_commit_callbacks):
    app.control.purge()
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(5):
            job_submit(user=ann, spec=JobSpec(name=f"burst-{i}", team=org.team_a, command="true"))
    assert _queued() == 1
    app.control.purge()
