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


@pytest.fixture(autouse=True)
def _short_last_cycle():
    """The window is 1 s after a short cycle: another test's cycle (in the cache) must not lengthen it."""
    cache.delete(common._LAST_CYCLE_S_KEY)


def _cache_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    for name in ("add", "get", "get_many"):
        real = getattr(cache, name)
        monkeypatch.setattr(cache, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))
    return calls


def test_a_burst_of_submits_asks_redis_once_for_its_cycle(org, ann, nodes, django_capture_on_commit_callbacks, monkeypatch):
    app.control.purge()
    calls = _cache_calls(monkeypatch)
    with django_capture_on_commit_callbacks(execute=True):
        for i in range(5):
            job_submit(user=ann, spec=JobSpec(name=f"burst-{i}", team=org.team_a, command="true"))
    # One round trip for the kick key and the last cycle's length, one to take the key.
    assert (calls, _queued()) == (["get_many", "add"], 1)
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
    assert (calls, _queued()) == (["get_many"], 0)
    now[0] += 0.4  # within the clocks' margin of the due time: ask again
    with django_capture_on_commit_callbacks(execute=True):
        job_submit(user=ann, spec=JobSpec(name="third", team=org.team_a, command="true"))
    assert calls == ["get_many", "get_many"]


def test_the_cycle_key_is_the_one_every_cycle_writes():
    from scheduling.cycle import CYCLE_SECONDS_CACHE_KEY

    assert common._LAST_CYCLE_S_KEY == CYCLE_SECONDS_CACHE_KEY


@pytest.mark.parametrize(
    ("last_cycle_s", "window"),
    [(None, 1), ("junk", 1), (0.0, 1), (0.3, 1), (0.5, 1), (0.51, 2), (1.2, 3), (2.0, 4), (2.4, 5), (4.7, 5), (60.0, 5)],
)
def test_the_window_is_twice_the_last_cycle_rounded_up_between_1_s_and_the_beat(settings, last_cycle_s, window):
    settings.YARD = {**settings.YARD, "CYCLE_INTERVAL_S": 5.0}
    assert common.cycle_window(last_cycle_s) == window


def test_after_a_long_cycle_a_burst_asks_for_one_cycle_twice_its_length_out(
    org, ann, nodes, django_capture_on_commit_callbacks, monkeypatch, settings
):
    """Behind a long queue (a 1.6 s cycle) a burst over 3 s makes one cycle, 4 s after its first submission,
    where a 1 s window made three (each walking the whole queue)."""
    settings.YARD = {**settings.YARD, "CYCLE_INTERVAL_S": 5.0}
    app.control.purge()
    cache.set(common._LAST_CYCLE_S_KEY, 1.6, None)
    sent: list[float] = []
    monkeypatch.setattr(common, "send_task", lambda name, countdown: sent.append(countdown))
    now = [1_000_000.0]
    monkeypatch.setattr(common.time, "time", lambda: now[0])
    for i in range(30):  # 10 a second for 3 s
        with django_capture_on_commit_callbacks(execute=True):
            job_submit(user=ann, spec=JobSpec(name=f"burst-{i}", team=org.team_a, command="true"))
        now[0] += 0.1
    assert sent == [4]
    assert cache.get(common._CYCLE_KICK_KEY) == pytest.approx(1_000_004.0)
    cache.delete(common._CYCLE_KICK_KEY)  # its 4 s in Redis are over
    now[0] = 1_000_004.1
    with django_capture_on_commit_callbacks(execute=True):
        job_submit(user=ann, spec=JobSpec(name="after", team=org.team_a, command="true"))
    assert sent == [4, 4]
