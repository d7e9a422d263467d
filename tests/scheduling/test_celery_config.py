"""Each promise of the Celery settings, read from the real app the workers run."""

from django.conf import settings

from portal.celery import app
from scheduling.tasks import run_cycle


def test_workers_prefetch_one_task_at_a_time():
    assert app.conf.worker_prefetch_multiplier == 1


def test_acks_late_is_off_by_default():
    assert app.conf.task_acks_late is False


def test_only_the_idempotent_cycle_acks_late():
    assert app.tasks["scheduling.tasks.run_cycle"].acks_late is True
    assert run_cycle.acks_late is True


def test_a_killed_workers_late_ack_task_is_redelivered():
    assert app.conf.task_reject_on_worker_lost is True


def test_soft_time_limit_comes_before_the_hard_one():
    assert 0 < app.conf.task_soft_time_limit < app.conf.task_time_limit


def test_time_limit_is_below_the_broker_visibility_timeout():
    # otherwise Redis redelivers a still-running task to a second worker
    visibility = app.conf.broker_transport_options.get("visibility_timeout", 3600)
    assert app.conf.task_time_limit < visibility


def test_beat_runs_the_cycle_every_configured_interval():
    entry = app.conf.beat_schedule["scheduling-cycle"]
    assert entry["task"] == run_cycle.name
    assert entry["schedule"] == settings.YARD["CYCLE_INTERVAL_S"]


def test_cycle_lease_outlasts_a_beat_interval():
    # the lease is renewed by every apply transaction; it must outlast a beat interval so that
    # beat ticks during a cycle find it held rather than free
    assert settings.YARD["CYCLE_LEASE_S"] > settings.YARD["CYCLE_INTERVAL_S"]
