"""The idle reaper's timing for any timeout and warning lead: the warning comes at most the lead (capped
to the timeout less a window) before the stop and stands that whole lead, and the stop time the owner
is shown is when the reaper does stop it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from scheduling.governance.reaper import idle_seconds, idle_warnings_for, policy_for, reap_at, reap_idle_notebooks
from scheduling.models import IdlePolicy, Job, JobKind
from tests.factories import make_cluster, make_org, make_user
from tests.governance.helpers import MINUTE, running_job, telemetry

T0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)
PASS_OFFSET = timedelta(seconds=7)  # the reaper's beat runs every minute, a few seconds into it
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("timeout_s", "lead_s"),
    [
        (45 * 60, 10 * 60),  # the defaults
        (5 * 60, 10 * 60),  # a lead longer than the timeout: capped, it warns at the first idle minute
        (10 * 60, 10 * 60),  # a lead equal to the timeout
        (3 * 60, 60),
        (150, 30),  # neither is a whole number of minutes
        (7 * 60, 0),  # no warning asked for
    ],
)
def test_the_warning_and_the_stop_come_when_the_policy_says(timeout_s, lead_s):
    org = make_org()
    node = make_cluster(nodes=1)[0]
    owner = make_user("nora", unit=org.team_a)
    IdlePolicy.objects.create(unit=org.team_a, timeout_s=timeout_s, warn_lead_s=lead_s)
    job = running_job(team=org.team_a, user=owner, node=node, gpus=1, start=T0, kind=JobKind.NOTEBOOK)
    telemetry(job, start=T0, minutes=timeout_s // 60 + 5, utilization=0)
    policy = policy_for(team=org.team_a, tier=job.tier)

    shown_at_warning = None
    warned_at = reaped_at = None
    promised = []  # the stop time the page shows, at every pass before the stop
    for minute in range(1, timeout_s // 60 + 5):
        now = T0 + minute * MINUTE + PASS_OFFSET
        job.refresh_from_db()
        if job.stop_requested_at is None:
            idle_s = idle_seconds(job=job, now=now, threshold_pct=policy.threshold_pct, cap_s=policy.timeout_s)
            promised.append(reap_at(job=job, policy=policy, idle_s=idle_s, now=now))
        report = reap_idle_notebooks(now=now)
        if job.pk in report.warned:
            warned_at = now
            [warning] = idle_warnings_for(owner, now=now)
            shown_at_warning = warning.stop_at
        if job.pk in report.reaped:
            reaped_at = now
            break
    assert reaped_at is not None
    stop_boundary = reaped_at - PASS_OFFSET  # the minute boundary the reaper's pass followed
    # Every promise made before the stop named the pass it came at: the first pass at or after the
    # promised moment stopped it, never one earlier, never one later. (The moment is the minute
    # boundary, or the end of the warning's lead, a pass's few seconds after one.)
    assert all(reaped_at - MINUTE < p <= reaped_at for p in promised), (promised, reaped_at)
    assert stop_boundary - T0 == timedelta(minutes=-(-timeout_s // 60))  # whole idle minutes reach the timeout
    lead = min(lead_s, timeout_s)
    if lead >= 60:
        assert warned_at is not None and reaped_at - MINUTE < shown_at_warning <= reaped_at
        assert timedelta(0) < stop_boundary - warned_at <= timedelta(seconds=lead)
        assert reaped_at - warned_at >= timedelta(seconds=policy.lead_s)  # the warning stood its whole lead
        # and not a pass sooner than the lead allows
        assert stop_boundary - (warned_at - MINUTE) > timedelta(seconds=lead) or warned_at - MINUTE < T0 + MINUTE
    elif lead == 0:
        assert warned_at is None
    assert Job.objects.get(pk=job.pk).stop_reason == "IDLE_TIMEOUT"
