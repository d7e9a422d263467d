"""The idle reaper: ends notebooks and dev sessions whose GPUs sat unused for their policy's timeout.

Dev sessions (docs/dev-sessions.md) are reaped exactly as notebooks: the same policy, warning, extension
and stop, decided by the same GPU telemetry. Below, "notebook" stands for either; an open SSH connection
keeps a dev session no more than an open browser tab keeps a notebook.

Idleness comes from the agents' GPU telemetry folded into one-minute windows (GpuWindow), as Run:ai
measures it — never from browser traffic: a kernel busy on the GPU with no browser open is working,
and a notebook whose page is reloaded all day but whose GPUs do nothing is idle.

Decisions:
* A minute is *idle* when every GPU the notebook holds has a window for it with samples and a peak
  utilisation at or under the policy's threshold (default 1 %). The peak, not the mean: a GPU that
  did anything in that minute was used. A minute is *used* when any of its GPUs has a window with
  samples and a peak above the threshold.
* Any other minute — no window yet for one of the GPUs (the agent is late, silent, or its windows
  arrive out of order), or a window without samples — is *unknown*: neither idle nor used. It does
  not count towards the timeout (the reaper only ever stops a notebook on positive evidence of
  idleness; a node whose agent is silent is the liveness check's business), and it does not end the
  idle spell either: only observed use does.
* The idle *spell* is the time since the newest used minute (or since every GPU of the gang was
  held), and its idle time the number of idle minutes observed in it, the newest counted being the
  last complete minute. A late window is simply counted when it comes: a late idle one adds to the
  spell, a late used one inside the spell ends it. The count looks back at most twice the timeout:
  idle minutes from before hours of silence are stale evidence, and the rows read stay bounded.
* Warning: once per spell, when the stop is within the policy's lead. It is withdrawn only when a
  minute of the spell it was given in shows use (recorded: idle_warned_at, idle_since), never for
  missing telemetry. The owner's extension also ends it (the owner's word is a sign of use): the
  extension's end is warned about again.
* A notebook is stopped when its idle time reaches the timeout, any extension has run out, and a
  warning has stood for the whole lead (now >= idle_warned_at + lead): idle time that grows by more
  than the lead at once (late telemetry arriving in bulk, a reaper that was down) warns first.
  With a lead of 0 no warning is given, none is waited for.
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
from django.db.models import Count, QuerySet
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
# The kinds the reaper stops when their GPUs sit idle, and what its notes call them.
REAPED_KINDS: dict[str, str] = {JobKind.NOTEBOOK: "notebook", JobKind.DEV: "dev session"}
# The ends of its stop notes ("idle for 45 min (GPU telemetry): stopping the notebook"), which
# notifications/derive.py recognises.
STOP_NOTES = tuple(f"stopping the {noun}" for noun in REAPED_KINDS.values())


def reaped_noun(job: Job) -> str:
    """What the reaper's notes and refusals call the job: "notebook", "dev session" (else "job")."""
    return REAPED_KINDS.get(job.kind, "job")


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
        """The warning's lead, capped to the timeout less one window: a lead that long warns at the first
        idle minute (a warning cannot come before the first idle minute was observed, and the stop waits
        for the warning to have stood the whole lead, so a longer lead would postpone the stop)."""
        return max(min(self.warn_lead_s, self.timeout_s - window().total_seconds()), 0.0)

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


@dataclass(frozen=True)
class IdleSpell:
    since: datetime  # the spell's windows start at or after this (after the newest used minute)
    idle_s: float  # idle minutes observed in it, in seconds, at most the cap (rounded up to whole windows)


def _held(job: Job) -> tuple[set[int], datetime] | None:
    """The GPUs the job's attempt holds and since when it holds all of them (None: it holds none)."""
    allocations = list(
        Allocation.objects.filter(job=job, attempt=job.attempt, released_at__isnull=True).values_list("gpu_id", "allocated_at")
    )
    if not allocations:
        return None
    return {gpu_id for gpu_id, _ in allocations}, max(at for _, at in allocations)


def _used(gpu_ids: set[int], *, threshold_pct: float) -> QuerySet[GpuWindow]:
    """The windows of these GPUs that show use: samples, and a peak above the threshold."""
    return GpuWindow.objects.filter(gpu_id__in=gpu_ids, samples__gt=0, utilization_max__gt=threshold_pct)


def idle_spell(*, job: Job, now: datetime, threshold_pct: float, cap_s: float) -> IdleSpell | None:
    """The job's current idle spell and its observed idle time (None: the job holds no GPUs)."""
    held = _held(job)
    if held is None:
        return None
    gpu_ids, held_since = held  # a minute counts only once every GPU of the gang is held
    newest = last_complete_window(now)
    size = window()
    cap_windows = math.ceil(cap_s / size.total_seconds())
    # Twice the cap: a spell may hold as much unknown time as idle time and still reach it; evidence
    # older than that is stale (the GPUs may well have been used while the agent was silent).
    oldest = max(held_since, newest - size * (2 * cap_windows - 1))
    last_used = (
        _used(gpu_ids, threshold_pct=threshold_pct)
        .filter(start__gte=oldest, start__lte=newest)
        .order_by("-start")
        .values_list("start", flat=True)
        .first()
    )
    since = oldest if last_used is None else last_used + size
    # Every window after the last used one with samples is an idle one: the minutes where every GPU
    # has one are the idle minutes; the others are unknown and are not counted.
    idle_windows = (
        GpuWindow.objects.filter(gpu_id__in=gpu_ids, start__gte=since, start__lte=newest, samples__gt=0)
        .values("start")
        .annotate(gpus=Count("gpu_id"))
        .filter(gpus=len(gpu_ids))
        .count()
    )
    return IdleSpell(since=since, idle_s=min(idle_windows, cap_windows) * size.total_seconds())


def idle_seconds(*, job: Job, now: datetime, threshold_pct: float, cap_s: float) -> float:
    """Idle minutes observed in the current idle spell, in seconds, at most ``cap_s`` (rounded up to whole minutes)."""
    spell = idle_spell(job=job, now=now, threshold_pct=threshold_pct, cap_s=cap_s)
    return 0.0 if spell is None else spell.idle_s


def used_since(*, job: Job, since: datetime, now: datetime, threshold_pct: float) -> bool:
    """Whether a complete minute from ``since`` on shows use of the job's GPUs (a late window counts too)."""
    held = _held(job)
    if held is None:
        return False
    return _used(held[0], threshold_pct=threshold_pct).filter(start__gte=since, start__lte=last_complete_window(now)).exists()


def reap_at(*, job: Job, policy: EffectivePolicy, idle_s: float, now: datetime) -> datetime:
    """The moment the reaper would stop the notebook if its GPUs stay idle from ``now`` on.

    The idle streak grows by one window at each minute boundary (the newest counted window is the last
    complete minute), so the timeout is reached at the boundary ``ceil((timeout - idle) / 1 min)`` minutes
    after the current one, whatever the timeout and the warning lead; an extension moves it to the
    extension's end if that is later, and to the end of the warning's lead if that is later still. (The
    reaper's pass after that moment stops it; it runs every minute.)
    """
    size = window()
    boundary = _floor(now, size)
    minutes_left = max(math.ceil((policy.timeout_s - idle_s) / size.total_seconds()), 0)
    moment = boundary + minutes_left * size  # minutes_left 0: due since this window began
    if job.idle_extended_at is not None:
        moment = max(moment, job.idle_extended_at + timedelta(seconds=policy.extend_s))
    if policy.lead_s > 0:
        # The stop also waits for a warning that stood the whole lead: one not given yet comes at a
        # pass from now on.
        warned = job.idle_warned_at if job.idle_warned_at is not None else now
        moment = max(moment, warned + timedelta(seconds=policy.lead_s))
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


def _live(*kinds: str) -> QuerySet[Job]:
    return Job.objects.filter(kind__in=kinds, state=JobState.RUNNING, stop_requested_at__isnull=True).select_related("team")


def _stop(job: Job, *, idle_s: float, lead_s: float, now: datetime) -> bool:
    """Stop the notebook unless another reaper (or anyone) already did, or its warning is not in force
    since ``lead_s`` (an owner's extension clears it); True if this call stopped it."""
    with transaction.atomic():
        live = Job.objects.select_for_update(skip_locked=True).filter(
            pk=job.pk, attempt=job.attempt, state=JobState.RUNNING, stop_requested_at__isnull=True
        )
        if lead_s > 0:
            live = live.filter(idle_warned_at__lte=now - timedelta(seconds=lead_s))
        locked = live.first()
        if locked is None:
            return False
        _note(locked, f"idle for {idle_s / 60:.0f} min (GPU telemetry): stopping the {reaped_noun(locked)}", now=now)
        job_request_stop(job=locked, reason="IDLE_TIMEOUT", actor_label=REAPER_LABEL)
        return True


def _warn(job: Job, *, since: datetime, due_in_s: float, now: datetime) -> bool:
    """Warn once for the idle spell that began at ``since`` (the conditional update: once, whoever runs)."""
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, idle_warned_at__isnull=True, stop_requested_at__isnull=True).update(
            idle_warned_at=now, idle_since=since
        ):
            return False
        minutes = max(math.ceil(due_in_s / 60), 0)
        _note(job, f"idle warning: its GPUs are unused; it will be stopped in about {minutes} min unless they are used", now=now)
        return True


def _clear_warning(job: Job, *, now: datetime) -> bool:
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, idle_warned_at=job.idle_warned_at).update(idle_warned_at=None, idle_since=None):
            return False
        _note(job, "idle warning withdrawn: its GPUs are in use again", now=now)
        return True


def _check_notebook(job: Job, policy: EffectivePolicy, now: datetime, report: ReapReport) -> None:
    if job.idle_warned_at is not None:
        # Only a minute that shows use withdraws the warning — late, out of order, whatever came before
        # it — never a minute that has not arrived: missing telemetry is unknown, not busy. (A warning
        # from before idle_since was recorded stands from its own time.)
        since = job.idle_since or job.idle_warned_at
        if used_since(job=job, since=since, now=now, threshold_pct=policy.threshold_pct):
            if _clear_warning(job, now=now):
                report.cleared.append(job.pk)
            return
    spell = idle_spell(job=job, now=now, threshold_pct=policy.threshold_pct, cap_s=policy.timeout_s)
    if spell is None:
        return
    due_in = seconds_to_reap(job=job, policy=policy, idle_s=spell.idle_s, now=now)
    lead = policy.lead_s
    if lead > 0 and job.idle_warned_at is None:
        # No stop without a warning first, however idle: the stop then waits the whole lead.
        if spell.idle_s > 0 and due_in <= lead and _warn(job, since=spell.since, due_in_s=max(due_in, lead), now=now):
            report.warned.append(job.pk)
        return
    warned_long_enough = lead == 0 or (job.idle_warned_at is not None and now >= job.idle_warned_at + timedelta(seconds=lead))
    if due_in <= 0 and warned_long_enough and _stop(job, idle_s=spell.idle_s, lead_s=lead, now=now):
        report.reaped.append(job.pk)


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
    """One pass of the reaper at ``now``: warn, stop idle notebooks and dev sessions, flag idle batch jobs."""
    book = PolicyBook()
    report = ReapReport()
    for job in _live(*REAPED_KINDS).order_by("pk"):
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
    """The user's running notebooks and dev sessions that the reaper has warned about (for the banner on their pages)."""
    if not user.is_authenticated:
        return []
    jobs = list(
        Job.objects.filter(
            user=user, kind__in=REAPED_KINDS, state=JobState.RUNNING, stop_requested_at__isnull=True, idle_warned_at__isnull=False
        )
        .select_related("team")
        .order_by("pk")
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


def job_extend_idle(*, job: Job, user: User, now: datetime) -> Job:
    """The owner postpones the idle stop of a notebook or dev session once, by the policy's ``extend_s``,
    if the policy allows it."""
    noun = reaped_noun(job)
    if job.user_id != user.pk:
        raise PermissionDenied(f"Only the {noun}'s owner can extend its idle timeout")
    if job.kind not in REAPED_KINDS or job.state != JobState.RUNNING or job.stop_requested_at is not None:
        raise ValidationError(f"Only a running {noun} that is not being stopped can be extended")
    policy = policy_for(team=job.team, tier=job.tier)
    if not policy.allow_extend:
        raise ValidationError(f"The idle policy ({policy.source}) does not allow extensions")
    with transaction.atomic():
        changed = Job.objects.filter(
            pk=job.pk, idle_extended_at__isnull=True, state=JobState.RUNNING, stop_requested_at__isnull=True
        ).update(idle_extended_at=now, idle_warned_at=None, idle_since=None)
        if not changed:
            raise ValidationError("The idle timeout was already extended once")
        job.refresh_from_db()
        _note(job, f"idle timeout extended by {policy.extend_s / 60:.0f} min by its owner", now=now, actor=user)
        audit(actor=user, action="job.idle_extend", obj=job, unit=job.team, message=f"extended idle timeout of {job.name}")
    return job


notebook_extend_idle = job_extend_idle  # its first name, when only notebooks were reaped
