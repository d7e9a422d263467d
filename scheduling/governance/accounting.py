"""Usage accounting: exact GPU-hours from allocation intervals, clipped to months in the cluster's time zone.

Definitions (each one a decision; the reports and the API show exactly these):

* **used** — the seconds each GPU was held by an allocation (``allocated_at`` to ``released_at``, or to
  ``now`` while live), clipped to the month. Months begin at local midnight of the 1st in
  ``settings.TIME_ZONE`` (the cluster's zone), so a DST month has 743 or 745 hours. Every attempt of a
  requeued job has its own allocations; they are summed, and should two intervals of one job on one GPU
  ever overlap (a stale row), the overlap is counted once.
* **borrowed** — GPU-hours beyond the guarantee: the integral over the month of max(0, GPUs the team
  held − its guarantee), per team and GPU type (``scheduling.selectors.borrowed_beyond``, the same rule as
  the API, ``yard quota`` and the portal; a parent unit: the sum of its teams'). Computed for units by
  the report (reports.py ``_beyond_guarantee``); a single job has no borrowed figure of its own.
* **reclaimable** — the part of *used* held by allocations flagged ``borrowed``: a job's hours on borrowed
  quota. The scheduler flags a whole job that runs even partly beyond the guarantee (a gang is reclaimed
  whole), so this can be more than *borrowed*; the per-job CSV shows it.
* **lost to preemption** — for an attempt that was preempted (a JobEvent to PREEMPTED for that attempt),
  the work since its newest checkpoint: from max(allocation start, checkpoint) to release. The checkpoint
  is the newest of the attempt's ``Task.checkpoint_at`` and ``Job.last_checkpoint_at`` that is not after
  the attempt's release (a later attempt's checkpoint does not save an earlier attempt's work).
* **idle reaped** — the GPU-hours of notebook sessions that the idle reaper ended (the reaped attempt's
  whole allocation time): what idle notebooks cost before they were stopped.
* **efficiency** — mean GPU utilisation over the allocated minutes that have telemetry (GpuWindow rows
  with samples). Minutes with no telemetry are left out of the mean rather than counted as zero, and
  ``measured_s`` says how much of the time the mean rests on.
* **attribution when a team moves** — hours follow the team: a team's hours of the whole month roll up
  under its *current* parents. The tree of a report is then always a strict partition, so every parent
  equals the sum of its children, and a reorganisation moves a team's history with it (as a cost centre
  move does in finance). A report of an old month therefore reflects today's tree.
"""

from __future__ import annotations

import calendar
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db.models import Count, DateTimeField, F, FloatField, OuterRef, Q, Subquery, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least

from scheduling.models import Allocation, GpuWindow, Job, JobEvent, Task
from scheduling.states import JobState


def _window_s() -> float:
    """Seconds of one GpuWindow row (a minute unless YARD_TELEMETRY_WINDOW_S says otherwise)."""
    return float(settings.YARD["TELEMETRY_WINDOW_S"])  # type: ignore[arg-type]


IDLE_TIMEOUT = "IDLE_TIMEOUT"
_MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


# --------------------------------------------------------------------------- months


def cluster_tz() -> ZoneInfo:
    return ZoneInfo(settings.TIME_ZONE)


@dataclass(frozen=True)
class Month:
    year: int
    month: int

    @property
    def label(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def start(self) -> datetime:
        # In UTC: Python subtracts two datetimes that share a tzinfo on the wall clock, which would
        # make a DST month 744 hours; UTC datetimes subtract exactly.
        return datetime(self.year, self.month, 1, tzinfo=cluster_tz()).astimezone(UTC)

    @property
    def end(self) -> datetime:
        return self.next().start

    @property
    def hours(self) -> float:
        return (self.end - self.start).total_seconds() / 3600

    def next(self) -> Month:
        return Month(self.year + self.month // 12, self.month % 12 + 1)

    def previous(self) -> Month:
        return Month(self.year - (self.month == 1), (self.month - 2) % 12 + 1)

    def days(self) -> list[date]:
        return [date(self.year, self.month, d) for d in range(1, calendar.monthrange(self.year, self.month)[1] + 1)]

    def __str__(self) -> str:
        return self.label


def parse_month(text: str) -> Month:
    """``"2026-11"`` -> Month; ValueError with a message a person can act on otherwise."""
    match = _MONTH_RE.match(text.strip())
    if not match or not 1 <= int(match.group(2)) <= 12 or int(match.group(1)) < 1970:
        raise ValueError(f"month must be YYYY-MM (e.g. 2026-11), not {text!r}")
    return Month(int(match.group(1)), int(match.group(2)))


def month_of(moment: datetime) -> Month:
    local = moment.astimezone(cluster_tz())
    return Month(local.year, local.month)


def _split_by_day(start: datetime, end: datetime, month: Month) -> Iterable[tuple[int, float]]:
    """(day index, seconds) pieces of [start, end), which lies inside ``month``."""
    tz = cluster_tz()
    cursor = start
    while cursor < end:
        local = cursor.astimezone(tz)
        # Wall-clock arithmetic on an aware datetime: a DST day is 23 or 25 real hours long.
        next_midnight = (datetime(local.year, local.month, local.day, tzinfo=tz) + timedelta(days=1)).astimezone(UTC)
        piece_end = min(end, next_midnight)
        yield local.day - 1, (piece_end - cursor).total_seconds()
        cursor = piece_end


# --------------------------------------------------------------------------- usage figures


@dataclass
class Usage:
    """Seconds of GPU time (GPU-seconds); hours and ratios are derived."""

    used_s: float = 0.0
    borrowed_s: float = 0.0  # beyond the guarantee: set for units by the report, 0 for a job
    reclaimable_s: float = 0.0  # held by allocations flagged borrowed
    lost_s: float = 0.0
    reaped_s: float = 0.0
    util_pct_s: float = 0.0  # sum of (mean utilisation % x measured seconds)
    measured_s: float = 0.0

    def add(self, other: Usage) -> None:
        self.used_s += other.used_s
        self.borrowed_s += other.borrowed_s
        self.reclaimable_s += other.reclaimable_s
        self.lost_s += other.lost_s
        self.reaped_s += other.reaped_s
        self.util_pct_s += other.util_pct_s
        self.measured_s += other.measured_s

    @property
    def used_gpu_hours(self) -> float:
        return self.used_s / 3600

    @property
    def borrowed_gpu_hours(self) -> float:
        return self.borrowed_s / 3600

    @property
    def reclaimable_gpu_hours(self) -> float:
        return self.reclaimable_s / 3600

    @property
    def lost_gpu_hours(self) -> float:
        return self.lost_s / 3600

    @property
    def reaped_gpu_hours(self) -> float:
        return self.reaped_s / 3600

    @property
    def efficiency(self) -> float | None:
        """Mean GPU utilisation over measured allocated time, 0..1; None without telemetry."""
        return self.util_pct_s / self.measured_s / 100 if self.measured_s else None


@dataclass
class JobUsage:
    job_id: int
    job_name: str
    user_id: int
    username: str
    team_id: int
    tier: int
    kind: str
    gpu_type: str
    state: str
    usage: Usage = field(default_factory=Usage)
    daily_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))


def _preempted_attempts(job_ids: set[int]) -> set[tuple[int, int]]:
    rows = JobEvent.objects.filter(job_id__in=job_ids, to_state=JobState.PREEMPTED).values_list("job_id", "attempt")
    return set(rows)


def _checkpoints(job_ids: set[int]) -> dict[tuple[int, int], list[datetime | None]]:
    """Checkpoint times the agents reported, per (job, attempt)."""
    found: dict[tuple[int, int], list[datetime | None]] = defaultdict(list)
    for job_id, attempt, at in Task.objects.filter(job_id__in=job_ids, checkpoint_at__isnull=False).values_list(
        "job_id", "attempt", "checkpoint_at"
    ):
        found[(job_id, attempt)].append(at)
    return found


def _checkpoint_before(candidates: Iterable[datetime | None], release: datetime) -> datetime | None:
    usable = [c for c in candidates if c is not None and c <= release]
    return max(usable) if usable else None


def job_usage(*, month: Month, now: datetime, team_ids: Iterable[int] | None = None) -> list[JobUsage]:
    """Every job that held a GPU during ``month`` (up to ``now``), with its figures; oldest job first."""
    start, end = month.start, min(month.end, now)
    if end <= start:
        return []
    window = GpuWindow.objects.filter(
        gpu=OuterRef("gpu"),
        samples__gt=0,
        start__gte=Greatest(OuterRef("allocated_at"), Value(start, output_field=DateTimeField())),
        start__lt=Least(
            Coalesce(OuterRef("released_at"), Value(now, output_field=DateTimeField())),
            Value(end, output_field=DateTimeField()),
        ),
    ).values("gpu")
    allocations = (
        Allocation.objects.filter(allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
        .annotate(
            util_sum=Subquery(window.annotate(s=Sum(F("utilization_sum") / F("samples"), output_field=FloatField())).values("s")),
            windows=Subquery(window.annotate(c=Count("id")).values("c")),
        )
        .order_by("job_id", "gpu_id", "allocated_at", "id")
    )
    if team_ids is not None:
        allocations = allocations.filter(job__team_id__in=list(team_ids))
    rows = list(allocations)
    job_ids = {a.job_id for a in rows}
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=job_ids).select_related("user")}
    preempted = _preempted_attempts(job_ids)
    checkpoints = _checkpoints(job_ids)

    result: dict[int, JobUsage] = {}
    covered: dict[tuple[int, int], datetime] = {}  # (job, gpu) -> counted up to
    window_s = _window_s()
    for alloc in rows:
        job = jobs[alloc.job_id]
        usage = result.get(job.pk)
        if usage is None:
            usage = result[job.pk] = JobUsage(
                job.pk, job.name, job.user_id, job.user.get_username(), job.team_id, job.tier, job.kind,
                job.gpu_type, job.state,
            )  # fmt: skip
        released = alloc.released_at or now
        lo = max(alloc.allocated_at, start, covered.get((job.pk, alloc.gpu_id), start))
        hi = min(released, end)
        covered[(job.pk, alloc.gpu_id)] = max(hi, covered.get((job.pk, alloc.gpu_id), start))
        if hi <= lo:
            continue
        seconds = (hi - lo).total_seconds()
        figures = usage.usage
        figures.used_s += seconds
        if alloc.borrowed:
            figures.reclaimable_s += seconds
        for day, piece in _split_by_day(lo, hi, month):
            usage.daily_s[day] += piece
        if (job.pk, alloc.attempt) in preempted and alloc.released_at is not None:
            checkpoint = _checkpoint_before([*checkpoints.get((job.pk, alloc.attempt), []), job.last_checkpoint_at], released)
            lost_from = max(lo, checkpoint) if checkpoint else lo
            figures.lost_s += max((hi - lost_from).total_seconds(), 0.0)
        if job.stop_reason == IDLE_TIMEOUT and alloc.attempt == job.attempt:
            figures.reaped_s += seconds
        figures.util_pct_s += (alloc.util_sum or 0.0) * window_s
        figures.measured_s += (alloc.windows or 0) * window_s
    return sorted(result.values(), key=lambda u: u.job_id)


def usage_by(rows: Iterable[JobUsage], *keys: str) -> dict[tuple[object, ...], Usage]:
    """Sum job figures by any of JobUsage's fields (``"team_id"``, ``"gpu_type"``, ``"tier"``, ``"user_id"``)."""
    totals: dict[tuple[object, ...], Usage] = defaultdict(Usage)
    for row in rows:
        totals[tuple(getattr(row, k) for k in keys)].add(row.usage)
    return dict(totals)
