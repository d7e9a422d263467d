"""The idle-notebook reaper: ends notebooks whose GPUs sat unused for their policy's timeout.

Idleness comes from the agents' GPU telemetry folded into one-minute windows (GpuWindow), as Run:ai
measures it — never from browser traffic: a kernel busy on the GPU with no browser open is working,
and a notebook whose page is reloaded all day but whose GPUs do nothing is idle.

Decisions:
* A minute is *idle* when every GPU the notebook holds has a window for it with samples and a peak
  utilisation at or under the policy's threshold (default 1 %). The peak, not the mean: a GPU that
  did anything in that minute was used.
* A minute with no samples for one of the GPUs (the agent was silent) is not idle evidence: it ends
  the idle streak. The reaper only ever stops a notebook on positive evidence of idleness; a node
  whose agent is silent is the liveness check's business.
* Only whole minutes inside the allocation count, the newest being the last complete minute.
* The idle time is the streak of idle minutes ending at the last complete minute. A notebook is
  stopped when it reaches the timeout and, if its owner extended once, the extension has run out.
* The stop is graceful (job_request_stop, reason IDLE_TIMEOUT: SIGTERM, grace, SIGKILL by the agent).
  Each stop is issued under the job's row lock after re-reading it, so two reapers at once never
  stop one notebook twice.
* Batch jobs are never stopped. A policy may ask to *flag* a batch job idle for
  ``flag_idle_batch_after_s`` to its team lead: a JobEvent and an AuditEntry, once per job.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from scheduling.models import Allocation, GpuWindow, IdlePolicy, Job, JobEvent, JobKind
from scheduling.services import job_request_stop
from scheduling.states import JobState
from tenants.models import AuditEntry, Membership, OrgUnit, Role
from tenants.services import audit


def window() -> timedelta:
    """The telemetry window (GpuWindow rows): a minute unless YARD_TELEMETRY_WINDOW_S says otherwise."""
    return timedelta(seconds=float(cast(float, settings.YARD["TELEMETRY_WINDOW_S"])))


def _floor(moment: datetime, size: timedelta) -> datetime:
    """The start of the window ``moment`` falls in (windows are aligned to the epoch, as agents fold them)."""
    step = size.total_seconds()
    return datetime.fromtimestamp(math.floor(moment.timestamp() / step) * step, tz=moment.tzinfo)


REAPER_LABEL = "idle-reaper"
FLAG_ACTION = "job.idle_batch_flag"
_DEFAULT = IdlePolicy()  # the model's field defaults: the one place they are written down


@dataclass(frozen=True)
class EffectivePolicy:
    timeout_s: float
    warn_lead_s: float
    allow_extend: bool
    extend_s: float
    threshold_pct: float
    flag_idle_batch_after_s: float | None
    source: str  # "default" or "<unit> tier <n|any>", shown to people

    @property
    def lead_s(self) -> float:
        """The warning's lead, capped to the timeout: a lead longer than the timeout warns at the first
        idle minute (a warning cannot come before the notebook went idle)."""
        return min(self.warn_lead_s, self.timeout_s)

    @classmethod
    def default(cls) -> EffectivePolicy:
        return cls(
            timeout_s=float(cast(float, settings.YARD["IDLE_NOTEBOOK_TIMEOUT_S"])),
            warn_lead_s=_DEFAULT.warn_lead_s,
            allow_extend=_DEFAULT.allow_extend,
            extend_s=_DEFAULT.extend_s,
            threshold_pct=_DEFAULT.utilization_threshold_pct,
            flag_idle_batch_after_s=None,
            source="default",
        )

    @classmethod
    def of(cls, row: IdlePolicy) -> EffectivePolicy:
        return cls(
            timeout_s=row.timeout_s,
            warn_lead_s=row.warn_lead_s,
            allow_extend=row.allow_extend,
            extend_s=row.extend_s,
            threshold_pct=row.utilization_threshold_pct,
            flag_idle_batch_after_s=row.flag_idle_batch_after_s,
            source=str(row),
        )


class PolicyBook:
    """Every IdlePolicy row, read once; resolves the policy of a (team, tier).

    The nearest unit up the tree that has a policy wins; at that unit a policy for the job's tier
    beats the tier-less one. (Nearness first: a team's own rule is the most specific statement.)
    """

    def __init__(self, rows: QuerySet[IdlePolicy] | None = None) -> None:
        self._by_unit: dict[int, dict[int | None, IdlePolicy]] = defaultdict(dict)
        for row in rows if rows is not None else IdlePolicy.objects.select_related("unit"):
            self._by_unit[row.unit_id][row.tier] = row

    def resolve(self, *, team: OrgUnit, tier: int) -> EffectivePolicy:
        for unit_id in reversed([int(x) for x in team.path.strip("/").split("/") if x]):
            at_unit = self._by_unit.get(unit_id)
            if at_unit:
                row = at_unit.get(tier) or at_unit.get(None)
                if row is not None:
                    return EffectivePolicy.of(row)
        return EffectivePolicy.default()


def policy_for(*, team: OrgUnit, tier: int) -> EffectivePolicy:
    return PolicyBook().resolve(team=team, tier=tier)


# --------------------------------------------------------------------------- idleness


def last_complete_window(now: datetime) -> datetime:
    """Start of the newest one-minute window that has ended by ``now``."""
    size = window()
    return _floor(now, size) - size


def idle_seconds(*, job: Job, now: datetime, threshold_pct: float, cap_s: float) -> float:
    """Length of the run of idle minutes ending at the last complete minute, at most ``cap_s`` (rounded up to whole minutes)."""
    allocations = list(
        Allocation.objects.filter(job=job, attempt=job.attempt, released_at__isnull=True).values_list("gpu_id", "allocated_at")
    )
    if not allocations:
        return 0.0
    gpu_ids = {gpu_id for gpu_id, _ in allocations}
    held_since = max(at for _, at in allocations)  # a minute counts only once every GPU of the gang is held
    newest = last_complete_window(now)
    size = window()
    oldest = max(held_since, newest - size * (math.ceil(cap_s / size.total_seconds()) - 1))
    windows: dict[datetime, dict[int, GpuWindow]] = defaultdict(dict)
    for w in GpuWindow.objects.filter(gpu_id__in=gpu_ids, start__gte=oldest, start__lte=newest):
        windows[w.start][w.gpu_id] = w
    streak = 0
    minute = newest
    while minute >= oldest:
        seen = windows.get(minute, {})
        idle = len(seen) == len(gpu_ids) and all(w.samples > 0 and w.utilization_max <= threshold_pct for w in seen.values())
        if not idle:
            break
        streak += 1
        minute -= size
    return streak * size.total_seconds()


def reap_at(*, job: Job, policy: EffectivePolicy, idle_s: float, now: datetime) -> datetime:
    """The moment the reaper would stop the notebook if its GPUs stay idle from ``now`` on.

    The idle streak grows by one window at each minute boundary (the newest counted window is the last
    complete minute), so the timeout is reached at the boundary ``ceil((timeout - idle) / 1 min)`` minutes
    after the current one, whatever the timeout and the warning lead; an extension moves it to the
    extension's end if that is later. (The reaper's pass after that moment stops it; it runs every minute.)
    """
    size = window()
    boundary = _floor(now, size)
    minutes_left = max(math.ceil((policy.timeout_s - idle_s) / size.total_seconds()), 0)
    moment = boundary + minutes_left * size  # minutes_left 0: due since this window began
    if job.idle_extended_at is not None:
        moment = max(moment, job.idle_extended_at + timedelta(seconds=policy.extend_s))
    return moment


def seconds_to_reap(*, job: Job, policy: EffectivePolicy, idle_s: float, now: datetime) -> float:
    """Seconds until the reaper stops the notebook if it stays idle (0 or less: due now)."""
    remaining = policy.timeout_s - idle_s
    if job.idle_extended_at is not None:
        remaining = max(remaining, (job.idle_extended_at + timedelta(seconds=policy.extend_s) - now).total_seconds())
    return remaining


# --------------------------------------------------------------------------- the reaper


@dataclass
class ReapReport:
    warned: list[int] = field(default_factory=list)
    cleared: list[int] = field(default_factory=list)
    reaped: list[int] = field(default_factory=list)
    flagged: list[int] = field(default_factory=list)


def _note(job: Job, reason: str, *, now: datetime, actor: User | None = None) -> None:
    JobEvent.objects.create(
        job=job, time=now, attempt=job.attempt, from_state=job.state, to_state="", reason=reason,
        actor=actor, actor_label=actor.get_username() if actor is not None else REAPER_LABEL,
    )  # fmt: skip


def _live(kind: str) -> QuerySet[Job]:
    return Job.objects.filter(kind=kind, state=JobState.RUNNING, stop_requested_at__isnull=True).select_related("team")


def _stop(job: Job, *, idle_s: float, now: datetime) -> bool:
    """Stop the notebook unless another reaper (or anyone) already did; True if this call stopped it."""
    with transaction.atomic():
        locked = (
            Job.objects.select_for_update(skip_locked=True)
            .filter(pk=job.pk, attempt=job.attempt, state=JobState.RUNNING, stop_requested_at__isnull=True)
            .first()
        )
        if locked is None:
            return False
        _note(locked, f"idle for {idle_s / 60:.0f} min (GPU telemetry): stopping the notebook", now=now)
        job_request_stop(job=locked, reason="IDLE_TIMEOUT", actor_label=REAPER_LABEL)
        return True


def _warn(job: Job, *, due_in_s: float, now: datetime) -> bool:
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, idle_warned_at__isnull=True, stop_requested_at__isnull=True).update(
            idle_warned_at=now
        ):
            return False
        minutes = max(math.ceil(due_in_s / 60), 0)
        _note(job, f"idle warning: its GPUs are unused; it will be stopped in about {minutes} min unless they are used", now=now)
        return True


def _clear_warning(job: Job, *, now: datetime) -> bool:
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, idle_warned_at__isnull=False).update(idle_warned_at=None):
            return False
        _note(job, "idle warning withdrawn: its GPUs are in use again", now=now)
        return True


def _check_notebook(job: Job, policy: EffectivePolicy, now: datetime, report: ReapReport) -> None:
    cap = policy.timeout_s
    idle_s = idle_seconds(job=job, now=now, threshold_pct=policy.threshold_pct, cap_s=cap)
    due_in = seconds_to_reap(job=job, policy=policy, idle_s=idle_s, now=now)
    if due_in <= 0:
        if _stop(job, idle_s=idle_s, now=now):
            report.reaped.append(job.pk)
    elif idle_s > 0 and due_in <= policy.lead_s:
        if job.idle_warned_at is None and _warn(job, due_in_s=due_in, now=now):
            report.warned.append(job.pk)
    elif job.idle_warned_at is not None and due_in > policy.lead_s and _clear_warning(job, now=now):
        report.cleared.append(job.pk)


def _team_leads(team: OrgUnit) -> list[str]:
    return sorted(Membership.objects.filter(unit=team, role=Role.TEAM_LEAD).values_list("user__username", flat=True))


def _flag_batch(job: Job, *, idle_s: float, now: datetime) -> bool:
    """Tell the team lead once that a batch job holds GPUs unused; never stop it."""
    with transaction.atomic():
        locked = Job.objects.select_for_update(skip_locked=True).filter(pk=job.pk).first()
        if locked is None or AuditEntry.objects.filter(action=FLAG_ACTION, object_type="job", object_id=str(job.pk)).exists():
            return False
        hours = idle_s / 3600
        message = f"batch job {job.name} has held {job.gpu_count} GPU(s) at zero utilisation for {hours:.1f} h"
        _note(locked, f"flagged to the team lead: {message}", now=now)
        audit(
            actor=None, actor_label=REAPER_LABEL, action=FLAG_ACTION, obj=locked, unit=job.team, message=message,
            data={"idle_s": idle_s, "team_leads": _team_leads(job.team)},
        )  # fmt: skip
        return True


def reap_idle_notebooks(*, now: datetime) -> ReapReport:
    """One pass of the reaper at ``now``: warn, stop idle notebooks, flag idle batch jobs."""
    book = PolicyBook()
    report = ReapReport()
    for job in _live(JobKind.NOTEBOOK):
        _check_notebook(job, book.resolve(team=job.team, tier=job.tier), now, report)
    for job in _live(JobKind.BATCH):
        policy = book.resolve(team=job.team, tier=job.tier)
        flag_after = policy.flag_idle_batch_after_s
        if not flag_after:
            continue
        idle_s = idle_seconds(job=job, now=now, threshold_pct=policy.threshold_pct, cap_s=flag_after)
        if idle_s >= flag_after and _flag_batch(job, idle_s=idle_s, now=now):
            report.flagged.append(job.pk)
    return report


# --------------------------------------------------------------------------- owner actions and reads


@dataclass(frozen=True)
class IdleWarning:
    job: Job
    stop_at: datetime
    can_extend: bool
    extend_minutes: int


def idle_warnings_for(user: User, *, now: datetime | None = None) -> list[IdleWarning]:
    """The user's running notebooks that the reaper has warned about (for the banner on their pages)."""
    if not user.is_authenticated:
        return []
    jobs = list(
        Job.objects.filter(
            user=user, kind=JobKind.NOTEBOOK, state=JobState.RUNNING, stop_requested_at__isnull=True, idle_warned_at__isnull=False
        ).select_related("team")
    )
    if not jobs:
        return []
    book = PolicyBook()
    warnings = []
    now = now or timezone.now()
    for job in jobs:
        policy = book.resolve(team=job.team, tier=job.tier)
        # From the idle streak itself, not from the warning's time plus the lead: the warning may come
        # later than the lead before the stop (a lead longer than the timeout, a reaper pass late).
        idle_s = idle_seconds(job=job, now=now, threshold_pct=policy.threshold_pct, cap_s=policy.timeout_s)
        stop_at = reap_at(job=job, policy=policy, idle_s=idle_s, now=now)
        can_extend = policy.allow_extend and job.idle_extended_at is None
        warnings.append(IdleWarning(job, stop_at, can_extend, round(policy.extend_s / 60)))
    return warnings


def notebook_extend_idle(*, job: Job, user: User, now: datetime) -> Job:
    """The owner postpones the idle stop once, by the policy's ``extend_s``, if the policy allows it."""
    if job.user_id != user.pk:
        raise PermissionDenied("Only the notebook's owner can extend its idle timeout")
    if job.kind != JobKind.NOTEBOOK or job.state != JobState.RUNNING or job.stop_requested_at is not None:
        raise ValidationError("Only a running notebook that is not being stopped can be extended")
    policy = policy_for(team=job.team, tier=job.tier)
    if not policy.allow_extend:
        raise ValidationError(f"The idle policy ({policy.source}) does not allow extensions")
    with transaction.atomic():
        changed = Job.objects.filter(
            pk=job.pk, idle_extended_at__isnull=True, state=JobState.RUNNING, stop_requested_at__isnull=True
        ).update(idle_extended_at=now, idle_warned_at=None)
        if not changed:
            raise ValidationError("The idle timeout was already extended once")
        job.refresh_from_db()
        _note(job, f"idle timeout extended by {policy.extend_s / 60:.0f} min by its owner", now=now, actor=user)
        audit(actor=user, action="job.idle_extend", obj=job, unit=job.team, message=f"extended idle timeout of {job.name}")
    return job
