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
from scheduling.services import JobSpec, common, job_submit

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


def _cache_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name in ("add", "get"):
        real = getattr(cache, name)
        monkeypatch.setattr(cache, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    return calls


def test_a_burst_of_submits_asks_redis_once_for_its_cycle(org, ann, nodes, django_capture_on_commit_callbacks, monkeypatch):
    app.control.purge()
    calls = _cache_calls(monkeypatch)
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(5):
            job_submit(user=ann, spec=JobSpec(name=f"burst-{i}", team=org.team_a, command="true"))
    assert (calls, _queued()) == (["add"], 1)
    app.control.purge()


def test_a_submit_after_the_requested_cycle_was_due_asks_for_another(
    org, ann, nodes, django_capture_on_commit_callbacks, monkeypatch
):
    app.control.purge()
    now = [1_000_000.0]
    monkeypatch.setattr(common.time, "time", lambda: now[0])
    with django_capture_on_commit_callbacks(execute=True):
        job_submit(user=ann, spec=JobSpec(name="first", team=org.team_a, command="true"))
    cache.delete(common._CYCLE_KICK_KEY)  # its 1 s in Redis are over
    now[0] += 1.5
    with django_capture_on_commit_callbacks(execute=True):
        job_submit(user=ann, spec=JobSpec(name="second", team=org.team_a, command="true"))
    assert _queued() == 2
    app.control.purge()


def test_a_cycle_another_process_requested_is_waited_for_without_asking_again(
    org, ann, nodes, django_capture_on_commit_callbacks, monkeypatch
):
    app.control.purge()
    now = [1_000_000.0]
    monkeypatch.setattr(common.time, "time", lambda: now[0])
    cache.add(common._CYCLE_KICK_KEY, now[0] + 1.0, timeout=1)  # another web process's request, due in 1 s
    calls = _cache_calls(monkeypatch)
    with django_capture_on_commit_callbacks(execute=True):
        job_submit(user=ann, spec=JobSpec(name="first", team=org.team_a, command="true"))
        now[0] += 0.5
        job_submit(user=ann, spec=JobSpec(name="second", team=org.team_a, command="true"))
    # The first learnt when that cycle is due; the second, committed well before then, asked nothing.
    assert (calls, _queued()) == (["add", "get"], 0)
    now[0] += 0.4  # within the clocks' margin of the due time: ask again
    with django_capture_on_commit_callbacks(execute=True):
        job_submit(user=ann, spec=JobSpec(name="third", team=org.team_a, command="true"))
    assert calls == ["add", "get", "add", "get"]
