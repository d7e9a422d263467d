"""The idle reaper when GPU telemetry arrives late and out of order, on PostgreSQL and on SQLite.

Windows (GpuWindow rows) are made directly, as the agents' heartbeats store them, but at the moments a
late or reordering agent delivers them: the newest minute missing at a pass, one GPU's window a pass
before another's, a backlog of minutes at once, a minute of use arriving after newer idle ones.
Missing telemetry is unknown, not busy: it never withdraws a warning; a notebook is stopped only after
a warning that stood for the whole lead; an idle spell gets one warning e-mail.

SQLite: ``test_the_same_behaviour_on_sqlite`` runs this module again, with pytest in a subprocess whose
DATABASE_URL is ``sqlite:///<tmp>/reaper.sqlite3`` (portal/settings.py reads it, and pytest-django
makes the child's test database on that engine), so every other test here also runs the reaper's
queries against SQLite, the demo's database; the child writes the engine it ran on to a file the
parent checks. Run directly, as the suite does, the module runs on PostgreSQL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from notifications.kinds import Channel, Kind
from notifications.models import DeliveryState, Notification
from notifications.services import notification_deliver, notifications_collect
from scheduling.governance.reaper import ReapReport, idle_seconds, idle_warnings_for, reap_idle_notebooks
from scheduling.models import Allocation, GpuWindow, Job, JobEvent, JobKind
from tests.factories import make_cluster, make_org, make_user
from tests.governance.helpers import MINUTE, running_job

T0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)
REPO = Path(__file__).resolve().parents[2]
VENDOR_FILE = "YARD_TEST_REAPER_VENDOR_FILE"  # set by the SQLite run: the child says which engine it got
pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _engine_reported() -> None:
    if path := os.environ.get(VENDOR_FILE):
        Path(path).write_text(connection.vendor)


@pytest.fixture
def world():
    org = make_org()
    node = make_cluster(nodes=1)[0]
    owner = make_user("nora", unit=org.team_a)
    owner.email = "nora@example.com"
    owner.save()
    return org, node, owner


def _notebook(world) -> Job:
    org, node, owner = world
    return running_job(team=org.team_a, user=owner, node=node, gpus=2, start=T0, kind=JobKind.NOTEBOOK, name="lab")


def _after(minutes: int) -> datetime:
    """A pass a few seconds into the minute after ``minutes`` whole windows have ended (the beat's)."""
    return T0 + minutes * MINUTE + timedelta(seconds=7)


def _pass(minutes: int) -> ReapReport:
    return reap_idle_notebooks(now=_after(minutes))


def _deliver(job: Job, minutes: Iterable[int], *, utilization: float = 0, gpus: Iterable[int] = (0, 1)) -> None:
    """The windows of these minutes for the job's GPUs number ``gpus`` (in index order), as an agent
    sends them; a window already stored is left as it is (agents resend the same values)."""
    gpu_ids = sorted(Allocation.objects.filter(job=job, released_at__isnull=True).values_list("gpu_id", flat=True))
    GpuWindow.objects.bulk_create(
        [
            GpuWindow(
                gpu_id=gpu_ids[g], start=T0 + m * MINUTE, samples=6, utilization_sum=6 * utilization,
                utilization_max=utilization, memory_used_max_mb=1024,
            )
            for m in minutes
            for g in gpus
        ],
        ignore_conflicts=True,
    )  # fmt: skip


def _notes(job: Job) -> list[str]:
    """The reaper's warnings, withdrawals and stop, in order (the words the notifications read)."""
    reasons = JobEvent.objects.filter(job=job, actor_label="idle-reaper").order_by("time", "id").values_list("reason", flat=True)
    return [r.split(":")[0] if r.startswith("idle warning") else "stop" for r in reasons if not r.startswith("stop ordered")]


def test_a_missing_newest_window_neither_withdraws_the_warning_nor_warns_again(world):
    job = _notebook(world)
    _deliver(job, range(35))
    assert _pass(35).warned == [job.pk]  # 35 idle minutes: the stop is 10 min (the lead) away
    reaped_at = None
    for m in range(36, 60):
        # From now on the newest minute has no window at any pass, and the second GPU's window of the
        # minute before comes a pass after the first GPU's: those minutes are unknown, not busy.
        _deliver(job, [m - 2], gpus=[0])
        _deliver(job, [m - 3], gpus=[1])
        report = _pass(m)
        assert report.cleared == [] and report.warned == [], m
        if report.reaped:
            reaped_at = m
            break
        job.refresh_from_db()
        assert job.idle_warned_at == _after(35), m  # the warning stays in force
    # 45 idle minutes observed (0..44, both GPUs) only at the pass of minute 47; the warning is 12 min old.
    assert reaped_at == 47
    assert _notes(job) == ["idle warning", "stop"]
    assert Job.objects.get(pk=job.pk).stop_reason == "IDLE_TIMEOUT"


def test_idle_minutes_that_arrive_in_bulk_warn_first_and_stop_only_after_the_whole_lead(world):
    _, _, owner = world
    job = _notebook(world)
    for m in range(1, 46):
        assert _pass(m) == ReapReport()  # the agent is silent: nothing is known, nothing is done
    _deliver(job, reversed(range(46)))  # its backlog arrives at once, newest first: 46 idle minutes
    report = _pass(46)
    assert report.warned == [job.pk] and report.reaped == []
    assert "stopped in about 10 min" in JobEvent.objects.get(job=job, reason__startswith="idle warning").reason
    [warning] = idle_warnings_for(owner, now=_after(46))
    assert warning.stop_at == _after(46) + 10 * MINUTE  # what the banner promises: the lead from the warning
    for m in range(47, 56):
        _deliver(job, [m - 1])
        assert _pass(m).reaped == [], m  # idle past the timeout, but the warning has not stood 10 min
    _deliver(job, [55])
    assert _pass(56).reaped == [job.pk]
    assert _notes(job) == ["idle warning", "stop"]


def test_only_a_late_window_that_shows_use_withdraws_the_warning(world):
    job = _notebook(world)
    _deliver(job, [m for m in range(36) if m != 20])
    _deliver(job, [20], gpus=[1])  # the first GPU's minute 20 is late: unknown, 35 idle minutes known
    assert _pass(36).warned == [job.pk]
    assert _pass(37).cleared == []  # minute 36 has not come: the warning stands
    _deliver(job, [36, 37])  # late idle minutes add to the spell
    assert _pass(38) == ReapReport()
    _deliver(job, [20], gpus=[0], utilization=70)  # the late minute 20 shows use: the spell ended there
    _deliver(job, [38])
    report = _pass(39)
    job.refresh_from_db()
    assert report.cleared == [job.pk] and job.idle_warned_at is None and job.idle_since is None
    events = []
    for m in range(40, 80):
        _deliver(job, [m - 1])
        report = _pass(m)
        events += [(m, what) for what in ("warned", "reaped", "cleared") for _ in getattr(report, what)]
        if report.reaped:
            break
    # The new spell begins at minute 21: 35 idle minutes at the pass of 56, 45 at the pass of 66.
    assert events == [(56, "warned"), (66, "reaped")]
    assert _notes(job) == ["idle warning", "idle warning withdrawn", "idle warning", "stop"]


def test_an_idle_spell_with_gaps_in_its_telemetry_sends_one_warning_email(world, settings, mailoutbox):
    settings.EMAIL_HOST = "127.0.0.1"  # e-mail is a channel (pytest-django's in-memory backend sends it)
    job = _notebook(world)
    stopped = None
    for m in range(1, 80):
        # Every third minute's windows come two passes late, the others one pass late.
        _deliver(job, [k for k in (m - 1, m - 3) if k >= 0 and (k % 3 == 0) == (k == m - 3)])
        if _pass(m).reaped:
            stopped = m
            break
    assert stopped is not None
    notifications_collect(now=max(timezone.now(), _after(stopped) + timedelta(hours=1)))
    for n in Notification.objects.filter(channel=Channel.EMAIL, state=DeliveryState.PENDING):
        notification_deliver(notification_id=n.pk, now=timezone.now())
    sent = Notification.objects.filter(channel=Channel.EMAIL, state=DeliveryState.SENT).values_list("event__kind", flat=True)
    assert sorted(sent) == sorted([Kind.IDLE_WARNING, Kind.IDLE_STOPPED])
    assert [m.to for m in mailoutbox] == [["nora@example.com"]] * 2
    assert _notes(job) == ["idle warning", "stop"]


def test_unknown_minutes_neither_count_nor_end_the_spell_within_twice_the_timeout(world):
    job = _notebook(world)

    def idle_min(minutes: int) -> float:
        return idle_seconds(job=job, now=_after(minutes), threshold_pct=1.0, cap_s=3600) / 60

    _deliver(job, range(20))
    _deliver(job, range(50, 75))  # minutes 20..49 never came (the agent was silent)
    assert idle_min(75) == 45
    _deliver(job, [20, 21], gpus=[0])  # one GPU's only: still unknown
    assert idle_min(75) == 45
    _deliver(job, [30], gpus=[1], utilization=50)  # a late minute of use ends the spell there
    assert idle_min(75) == 25
    # Hours later the old minutes are stale: only the last twice the cap (120 min) is read.
    _deliver(job, range(300, 310))
    assert idle_min(310) == 10


@pytest.mark.slow
@pytest.mark.skipif(bool(os.environ.get(VENDOR_FILE)), reason="this is the SQLite run itself")
def test_the_same_behaviour_on_sqlite(tmp_path):
    vendor = tmp_path / "vendor"
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'reaper.sqlite3'}",
        "YARD_VAR_DIR": str(tmp_path / "var"),
        VENDOR_FILE: str(vendor),
    }
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", str(Path(__file__).relative_to(REPO))],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-2000:]
    assert "5 passed, 1 skipped" in child.stdout, child.stdout[-2000:]
    assert vendor.read_text() == "sqlite"
