"""Usage accounting: GPU-seconds computed by hand, to the second; rollups where parents equal their children."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduling.governance.accounting import Month, job_usage, parse_month, usage_by
from scheduling.governance.reports import build_report
from scheduling.models import GpuWindow, JobEvent, JobKind
from scheduling.states import JobState
from tenants.services import unit_move
from tests.factories import make_cluster, make_job, make_org, make_user
from tests.governance.helpers import attempt

pytestmark = pytest.mark.django_db
NOV = Month(2026, 11)
OCT = Month(2026, 10)
END_OF_TIME = datetime(2027, 6, 1, tzinfo=UTC)


def at(day: int, hour: int, minute: int = 0, second: int = 0, month: int = 11) -> datetime:
    return datetime(2026, month, day, hour, minute, second, tzinfo=UTC)


@pytest.fixture
def world():
    org = make_org()
    nodes = make_cluster(nodes=2)
    user = make_user("ada", unit=org.team_a)
    return org, nodes, user


def _used(month: Month, now: datetime = END_OF_TIME) -> dict[int, float]:
    return {r.job_id: r.usage.used_s for r in job_usage(month=month, now=now)}


def test_parse_month_rejects_a_bad_month_with_a_clear_message():
    with pytest.raises(ValueError, match="month must be YYYY-MM"):
        parse_month("2026-13")


def test_month_hours_count_the_dst_change(settings):
    settings.TIME_ZONE = "Europe/Berlin"
    assert (Month(2026, 10).hours, Month(2026, 3).hours, Month(2026, 11).hours) == (745, 743, 720)


def test_job_spanning_a_month_boundary_is_split_to_the_second(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, gpus_per_replica=2)
    attempt(job, node=nodes[0], number=1, gpus=[0, 1], start=at(31, 22, month=10), end=at(1, 1, 30, 15))
    assert _used(OCT) == {job.pk: 2 * 2 * 3600}
    assert _used(NOV) == {job.pk: 2 * (3600 + 30 * 60 + 15)}


def test_month_boundary_is_midnight_in_the_cluster_time_zone(world, settings):
    settings.TIME_ZONE = "Europe/Berlin"  # November starts at 23:00 UTC on 31 October (CET)
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(31, 22, month=10), end=at(31, 23, 30, month=10))
    assert (_used(OCT), _used(NOV)) == ({job.pk: 3600}, {job.pk: 1800})


def test_live_allocation_counts_until_now(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, state=JobState.RUNNING)
    attempt(job, node=nodes[0], number=1, gpus=[0, 1, 2], start=at(10, 8), end=None)
    assert _used(NOV, now=at(10, 9, 0, 10)) == {job.pk: 3 * 3610}


def test_requeued_job_counts_each_attempt_once(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, attempt=2)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(5, 10), end=at(5, 11))
    attempt(job, node=nodes[1], number=2, gpus=[0], start=at(5, 12), end=at(5, 12, 30))
    assert _used(NOV) == {job.pk: 3600 + 1800}


def test_overlapping_rows_of_one_job_on_one_gpu_count_once(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, attempt=2)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(5, 10), end=at(5, 11))
    attempt(job, node=nodes[0], number=2, gpus=[0], start=at(5, 10, 30), end=at(5, 11, 30))  # a stale overlapping row
    assert _used(NOV) == {job.pk: 5400}


def _preempt(job, number: int, when: datetime) -> None:
    JobEvent.objects.create(job=job, time=when, attempt=number, from_state="PREEMPTING", to_state=JobState.PREEMPTED)


def test_preempted_attempt_loses_the_work_since_its_checkpoint(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, attempt=2, state=JobState.RUNNING, last_checkpoint_at=at(7, 12, 40))
    attempt(job, node=nodes[0], number=1, gpus=[0, 1], start=at(7, 10), end=at(7, 12), checkpoint_at=at(7, 11, 15))
    _preempt(job, 1, at(7, 12))
    attempt(job, node=nodes[1], number=2, gpus=[0, 1], start=at(7, 12, 10), end=None)
    [row] = job_usage(month=NOV, now=at(7, 13))
    assert row.usage.used_s == 2 * 7200 + 2 * 50 * 60
    assert row.usage.lost_s == 2 * 45 * 60  # 11:15 -> 12:00 on two GPUs; the 12:40 checkpoint is attempt 2's


def test_preempted_attempt_without_a_checkpoint_loses_all_its_work(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, attempt=2)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(7, 10), end=at(7, 10, 20, 5))
    _preempt(job, 1, at(7, 10, 20, 5))
    [row] = job_usage(month=NOV, now=at(8, 0))
    assert row.usage.lost_s == 20 * 60 + 5


def test_job_checkpoint_reported_on_the_job_counts_for_its_attempt(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, last_checkpoint_at=at(7, 10, 50))
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(7, 10), end=at(7, 11))
    _preempt(job, 1, at(7, 11))
    [row] = job_usage(month=NOV, now=at(8, 0))
    assert row.usage.lost_s == 600


def test_reclaimable_hours_are_the_borrowed_allocations(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, gpus_per_replica=2)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(3, 0), end=at(3, 2), borrowed=False)
    attempt(job, node=nodes[1], number=2, gpus=[0], start=at(3, 0), end=at(3, 1), borrowed=True)
    [row] = job_usage(month=NOV, now=at(8, 0))
    assert (row.usage.used_s, row.usage.reclaimable_s, row.usage.borrowed_s) == (3 * 3600, 3600, 0.0)


def test_idle_reaped_notebook_hours(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user, kind=JobKind.NOTEBOOK, state=JobState.CANCELLED, stop_reason="IDLE_TIMEOUT")
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(3, 9), end=at(3, 10, 1))
    [row] = job_usage(month=NOV, now=at(8, 0))
    assert row.usage.reaped_s == 3660


def test_efficiency_is_mean_utilisation_over_measured_minutes(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(3, 9), end=at(3, 10))
    gpu = job.allocations.get().gpu
    for minute in range(60):
        util = 50.0 if minute < 30 else 100.0
        GpuWindow.objects.create(gpu=gpu, start=at(3, 9, minute), samples=4, utilization_sum=4 * util, utilization_max=util)
    GpuWindow.objects.create(gpu=gpu, start=at(3, 10), samples=4, utilization_sum=0, utilization_max=0)  # after release
    [row] = job_usage(month=NOV, now=at(8, 0))
    assert row.usage.efficiency == pytest.approx(0.75) and row.usage.measured_s == 3600


def test_usage_by_gpu_type_tier_and_user(world):
    org, nodes, user = world
    other = make_user("bob", unit=org.team_a)
    j1 = make_job(team=org.team_a, user=user, tier=1)
    j2 = make_job(team=org.team_a, user=other, tier=3)
    attempt(j1, node=nodes[0], number=1, gpus=[0], start=at(3, 0), end=at(3, 1))
    attempt(j2, node=nodes[0], number=1, gpus=[1, 2], start=at(3, 0), end=at(3, 2))
    rows = job_usage(month=NOV, now=at(8, 0))
    assert {k: u.used_s for k, u in usage_by(rows, "tier").items()} == {(1,): 3600, (3,): 4 * 3600}
    assert {k: u.used_s for k, u in usage_by(rows, "user_id", "gpu_type").items()} == {
        (user.pk, "H100"): 3600,
        (other.pk, "H100"): 4 * 3600,
    }


def _check_parents_sum_children(node) -> None:
    for child in node.children:
        _check_parents_sum_children(child)
    if node.children:
        for i, line in enumerate(node.lines):
            assert line.usage.used_s == pytest.approx(sum(c.lines[i].usage.used_s for c in node.children), abs=1e-6)
            assert line.usage.borrowed_s == pytest.approx(sum(c.lines[i].usage.borrowed_s for c in node.children), abs=1e-6)


def test_every_parent_equals_the_sum_of_its_children(world):
    org, nodes, user = world
    carl = make_user("carl", unit=org.team_c)
    for i, (team, who) in enumerate([(org.team_a, user), (org.team_b, user), (org.team_c, carl)]):
        job = make_job(team=team, user=who)
        attempt(job, node=nodes[0], number=1, gpus=[i], start=at(2 + i, 0), end=at(2 + i, 3 + i, 7, 11), borrowed=i == 1)
    report = build_report(month=NOV, tops=[org.root], now=END_OF_TIME)
    _check_parents_sum_children(report.tops[0])
    totals = {n.unit.name: n.total.used_s for n in report.nodes()}
    assert totals["Cluster"] == (3 * 3600 + 431) + (4 * 3600 + 431) + (5 * 3600 + 431)
    assert totals["Research"] == totals["Vision"] == totals["team-a"] + totals["team-b"]


def test_a_team_moved_mid_month_brings_its_whole_month_to_its_new_department(world):
    org, nodes, user = world
    job = make_job(team=org.team_b, user=user)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(2, 0), end=at(2, 10))  # before the move
    unit_move(actor=None, unit=org.team_b, new_parent=org.other_dept)
    job2 = make_job(team=org.team_b, user=user)
    attempt(job2, node=nodes[0], number=1, gpus=[1], start=at(20, 0), end=at(20, 5))  # after the move
    report = build_report(month=NOV, tops=[org.root], now=END_OF_TIME)
    totals = {n.unit.name: n.total.used_s for n in report.nodes()}
    assert totals["Search"] == totals["Products"] == 15 * 3600
    assert totals["Vision"] == totals["Research"] == 0
    _check_parents_sum_children(report.tops[0])


def test_guaranteed_gpu_hours_are_guarantee_times_hours_in_month(world):
    org, _, _ = world
    report = build_report(month=NOV, tops=[org.team_a], now=END_OF_TIME)
    assert report.tops[0].guaranteed_gpu_hours == 16 * 720


def test_daily_usage_splits_at_local_midnight(world):
    org, nodes, user = world
    job = make_job(team=org.team_a, user=user)
    attempt(job, node=nodes[0], number=1, gpus=[0], start=at(4, 23), end=at(5, 0, 30))
    [row] = job_usage(month=NOV, now=END_OF_TIME)
    assert dict(row.daily_s) == {3: 3600, 4: 1800}
    assert sum(row.daily_s.values()) == row.usage.used_s == timedelta(minutes=90).total_seconds()


def test_report_takes_a_fixed_number_of_queries_however_many_jobs(world, django_assert_max_num_queries):
    org, nodes, user = world
    for i in range(12):
        job = make_job(team=org.team_a if i % 2 else org.team_c, user=user)
        attempt(job, node=nodes[i % 2], number=1, gpus=[i // 2], start=at(3, i), end=at(3, i + 1))
        _preempt(job, 1, at(3, i + 1))
    with django_assert_max_num_queries(7):
        report = build_report(month=NOV, tops=[org.root], now=END_OF_TIME)
    assert report.tops[0].total.used_s == 12 * 3600
