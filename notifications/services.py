"""Writes of the notifications app: collecting events into the outbox, delivering them, preferences, webhooks.

Collecting. A Celery beat task reads JobEvent and AuditEntry rows past a stored watermark, holding the
watermark's row lock (SELECT … FOR UPDATE SKIP LOCKED: a second worker that finds it locked does
nothing), and creates Event and Notification rows in the same transaction. The unique keys on Event
(its source row) and Notification (event × recipient × channel) are the last line of defence: even two
collectors at once cannot make two.

Rows of a transaction that commits late can carry a lower id than rows already read (ids are handed
out at insert, visible at commit). So the watermark only moves past rows older than SETTLE_S; younger
rows are read again at the next pass and skipped by their Event key. A transaction that writes job
events and stays open longer than SETTLE_S could lose its notifications; the cycle's are far shorter.

Delivering. E-mails and webhooks are sent by a Celery task per notification, queued after commit;
each send is claimed with a conditional UPDATE (PENDING -> SENDING), so two workers never send one
notification twice. A failure is retried with exponential backoff up to MAX_ATTEMPTS; a webhook that
fails WEBHOOK_DISABLE_AFTER times in a row is switched off and its owner told in the portal.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from notifications.channels import DeliveryError, check_webhook_url, email_enabled, notify_settings, post_webhook, send_email
from notifications.derive import EventSpec, from_audit_entry, from_job_event, near_limit
from notifications.kinds import CHOOSABLE, DEFAULTS, Channel, Kind
from notifications.models import DeliveryState, Event, Notification, Preference, Watermark, Webhook
from scheduling.models import Job, JobEvent, Service
from scheduling.states import JobState
from tenants.dispatch import send_task
from tenants.models import ApiToken, AuditEntry, Membership, OrgUnit, Role, TokenKind, UnitKind

log = logging.getLogger(__name__)

SETTLE_S = 120.0
BATCH = 500
MAX_ROWS_PER_PASS = 20_000
STUCK_SENDING_S = 600.0  # a worker that died mid-send: its notification is tried again after this
LOST_TASK_S = 60.0  # a PENDING notification this overdue lost its task (broker hiccup): queue it again
MAX_BACKOFF_S = 3600.0


# --------------------------------------------------------------------------- preferences


def wanted(*, prefs: dict[tuple[int, str, str], bool], user_id: int, kind: str, channel: str) -> bool:
    found = prefs.get((user_id, kind, channel))
    return found if found is not None else kind in DEFAULTS[channel]


def _prefs_for(user_ids: Iterable[int], kinds: Iterable[str]) -> dict[tuple[int, str, str], bool]:
    rows = Preference.objects.filter(user_id__in=list(user_ids), kind__in=list(kinds))
    return {(p.user_id, p.kind, p.channel): p.enabled for p in rows}


@transaction.atomic
def preferences_set(*, user: User, choices: dict[tuple[str, str], bool]) -> None:
    """Store the user's choice for each (kind, channel) given; kinds and channels are checked."""
    for (kind, channel), enabled in choices.items():
        if kind not in CHOOSABLE or channel not in (Channel.PORTAL, Channel.EMAIL):
            raise ValidationError(f"{kind}/{channel} is not a preference one can set")
        Preference.objects.update_or_create(user=user, kind=kind, channel=channel, defaults={"enabled": enabled})


# --------------------------------------------------------------------------- recipients and the outbox


def _service_user_ids(user_ids: Iterable[int]) -> set[int]:
    """Team service accounts (CI tokens) own jobs but read nothing: their team's webhooks speak for them."""
    return set(ApiToken.objects.filter(user_id__in=list(user_ids), kind=TokenKind.SERVICE).values_list("user_id", flat=True))


def _teams_under(unit: OrgUnit) -> list[int]:
    if unit.kind == UnitKind.TEAM:
        return [unit.pk]
    return list(OrgUnit.objects.filter(kind=UnitKind.TEAM, path__startswith=unit.path).values_list("pk", flat=True))


def _recipients(spec: EventSpec) -> tuple[list[User], list[int]]:
    """(users, team ids whose webhooks hear of it)."""
    if spec.kind == Kind.QUOTA_CHANGED:
        assert spec.team is not None
        team_ids = _teams_under(spec.team)
        actor_id = AuditEntry.objects.filter(pk=int(spec.data["audit"])).values_list("actor_id", flat=True).first()
        user_ids = set(Membership.objects.filter(unit_id__in=team_ids).values_list("user_id", flat=True)) - {actor_id}
        users = list(User.objects.filter(pk__in=user_ids - _service_user_ids(user_ids), is_active=True))
        return users, team_ids
    if spec.kind in (Kind.SERVICE_CRASH_LOOP, Kind.SERVICE_ROLLED_BACK):
        service = Service.objects.select_related("user").filter(pk=int(spec.data["service"])).first()
        if service is None:
            return [], []
        leads = set(Membership.objects.filter(unit_id=service.team_id, role=Role.TEAM_LEAD).values_list("user_id", flat=True))
        user_ids = leads | {service.user_id}
        users = list(User.objects.filter(pk__in=user_ids - _service_user_ids(user_ids), is_active=True))
        return users, [service.team_id]
    assert spec.job is not None
    owner = spec.job.user
    users = [owner] if owner.is_active and not _service_user_ids([owner.pk]) else []
    return users, [spec.job.team_id]


def _emit(spec: EventSpec, *, now: datetime) -> list[int]:
    """Create the event and its notifications unless its key exists; returns the ids to deliver."""
    event, created = Event.objects.get_or_create(
        key=spec.key,
        defaults={
            "kind": spec.kind, "time": spec.time, "job": spec.job, "team": spec.team, "title": spec.title[:200],
            "body": spec.body, "link": spec.link, "data": spec.data,
        },
    )  # fmt: skip
    if not created:
        return []
    users, team_ids = _recipients(spec)
    prefs = _prefs_for([u.pk for u in users], [spec.kind])
    mail = email_enabled()
    rows: list[Notification] = []
    for user in users:
        if wanted(prefs=prefs, user_id=user.pk, kind=spec.kind, channel=Channel.PORTAL):
            rows.append(Notification(event=event, user=user, channel=Channel.PORTAL, state=DeliveryState.SENT, sent_at=now))
        if mail and user.email and wanted(prefs=prefs, user_id=user.pk, kind=spec.kind, channel=Channel.EMAIL):
            rows.append(Notification(event=event, user=user, channel=Channel.EMAIL, next_attempt_at=now))
    hooks = Webhook.objects.filter(Q(user__in=users) | Q(team_id__in=team_ids), active=True)
    rows += [
        Notification(event=event, user=hook.user, channel=Channel.WEBHOOK, webhook=hook, next_attempt_at=now)
        for hook in hooks
        if spec.kind in hook.kinds
    ]
    made = Notification.objects.bulk_create(rows)
    return [n.pk for n in made if n.channel != Channel.PORTAL]


def _deliver(pk: int) -> None:
    """Queue one delivery, by the task's name (notifications.tasks imports this module)."""
    send_task("notifications.tasks.deliver", (pk,))


def _dispatch(ids: list[int]) -> None:
    if not ids:
        return

    def send() -> None:
        for pk in ids:
            _deliver(pk)

    # robust: a broker hiccup must not undo the collect; the sweep queues lost deliveries again.
    transaction.on_commit(send, robust=True)


@dataclass
class CollectReport:
    events: int = 0
    deliveries: int = 0  # e-mails and webhook calls queued (in-portal items need no delivery)
    skipped_locked: list[str] = field(default_factory=list)


def _scan(name: str, queryset: Any, derive: Any, *, now: datetime, report: CollectReport) -> None:
    Watermark.objects.get_or_create(name=name)
    with transaction.atomic():
        mark = Watermark.objects.select_for_update(skip_locked=True).filter(name=name).first()
        if mark is None:
            report.skipped_locked.append(name)  # another collector holds it: it does this pass
            return
        settled, cursor, read, ids = mark.last_id, mark.last_id, 0, []
        horizon = now - timedelta(seconds=SETTLE_S)
        while read < MAX_ROWS_PER_PASS:
            rows = list(queryset.filter(pk__gt=cursor).order_by("pk")[:BATCH])
            if not rows:
                break
            specs = [(row, derive(row)) for row in rows]
            seen = set(Event.objects.filter(key__in=[s.key for _, s in specs if s]).values_list("key", flat=True))
            for row, spec in specs:
                if spec is not None and spec.key not in seen:
                    made = _emit(spec, now=now)
                    ids += made
                    report.events += 1
                    report.deliveries += len(made)
                if row.pk == settled + 1 or row.time <= horizon:
                    # Contiguous ids cannot hide a late commit below them; below an old row, a gap can
                    # only belong to a transaction open longer than SETTLE_S.
                    settled = row.pk
            cursor = rows[-1].pk
            read += len(rows)
        if settled != mark.last_id:
            Watermark.objects.filter(name=name).update(last_id=settled, updated_at=now)
        _dispatch(ids)


def _near_limits(*, now: datetime, report: CollectReport) -> None:
    lead = float(notify_settings().get("TIME_LIMIT_LEAD_S", 1800.0))
    running = Job.objects.filter(state=JobState.RUNNING, started_at__isnull=False).select_related("team", "user")
    specs = [s for s in (near_limit(job, now=now, lead_s=lead) for job in running) if s is not None]
    if not specs:
        return
    with transaction.atomic():
        seen = set(Event.objects.filter(key__in=[s.key for s in specs]).values_list("key", flat=True))
        ids: list[int] = []
        for spec in specs:
            if spec.key in seen:
                continue
            made = _emit(spec, now=now)
            ids += made
            report.events += 1
            report.deliveries += len(made)
        _dispatch(ids)


def _sweep(*, now: datetime) -> None:
    """Deliveries whose task was lost (broker down at commit) or whose worker died mid-send: queue again."""
    Notification.objects.filter(state=DeliveryState.SENDING, claimed_at__lt=now - timedelta(seconds=STUCK_SENDING_S)).update(
        state=DeliveryState.PENDING, next_attempt_at=now
    )
    overdue = list(
        Notification.objects.filter(
            state=DeliveryState.PENDING, next_attempt_at__lt=now - timedelta(seconds=LOST_TASK_S)
        ).values_list("pk", flat=True)[:1000]
    )
    for pk in overdue:
        _deliver(pk)


def notifications_collect(*, now: datetime) -> CollectReport:
    """One pass: job events, quota changes, jobs near their time limit, and lost deliveries."""
    report = CollectReport()
    _scan("jobevent", JobEvent.objects.select_related("job", "job__team", "job__user"), from_job_event, now=now, report=report)
    _scan("audit", AuditEntry.objects.select_related("unit"), from_audit_entry, now=now, report=report)
    _near_limits(now=now, report=report)
    _sweep(now=now)
    return report


# --------------------------------------------------------------------------- delivery


def _backoff_s(attempts: int) -> float:
    base = float(notify_settings().get("RETRY_BASE_S", 30.0))
    return float(min(base * 4 ** max(attempts - 1, 0), MAX_BACKOFF_S))


def _webhook_owners(hook: Webhook) -> list[User]:
    if hook.user is not None:
        return [hook.user]
    lead_ids = set(Membership.objects.filter(unit=hook.team, role=Role.TEAM_LEAD).values_list("user_id", flat=True))
    if hook.created_by_id:
        lead_ids.add(hook.created_by_id)
    return list(User.objects.filter(pk__in=lead_ids, is_active=True))


def _webhook_failed(hook: Webhook, error: str, *, now: datetime) -> None:
    limit = int(notify_settings().get("WEBHOOK_DISABLE_AFTER", 10))
    with transaction.atomic():
        Webhook.objects.filter(pk=hook.pk).update(
            consecutive_failures=F("consecutive_failures") + 1, last_error=error[:1000], last_failure_at=now
        )
        # Disabled once, by whoever crosses the limit (the conditional UPDATE decides).
        disabled = Webhook.objects.filter(pk=hook.pk, active=True, consecutive_failures__gte=limit).update(
            active=False, disabled_at=now
        )
        if not disabled:
            return
        hook.refresh_from_db()
        Notification.objects.filter(webhook=hook, state=DeliveryState.PENDING).update(
            state=DeliveryState.FAILED, last_error="the webhook was disabled"
        )
        event = Event.objects.create(
            key=f"webhook-disabled:{hook.pk}:{now.timestamp():.0f}",
            kind=Kind.WEBHOOK_DISABLED,
            time=now,
            team=hook.team,
            title=f"Webhook {hook.name} was disabled after {hook.consecutive_failures} failed deliveries in a row",
            body=f"Last error: {error[:300]}. Fix the receiving end, then enable it again on the webhooks page.",
            link="/notifications/webhooks/",
            data={"webhook": hook.pk},
        )
        Notification.objects.bulk_create(
            Notification(event=event, user=owner, channel=Channel.PORTAL, state=DeliveryState.SENT, sent_at=now)
            for owner in _webhook_owners(hook)
        )


def notification_deliver(*, notification_id: int, now: datetime) -> float | None:
    """Send one e-mail or webhook call if it is due and nobody else is sending it.

    Returns the seconds after which to try again, or None (sent, failed for good, or not ours to send).
    """
    claimed = Notification.objects.filter(
        pk=notification_id, state=DeliveryState.PENDING, next_attempt_at__lte=now + timedelta(seconds=1)
    ).update(state=DeliveryState.SENDING, claimed_at=now, attempts=F("attempts") + 1)
    if not claimed:
        return None
    notification = Notification.objects.select_related("event", "event__team", "user", "webhook").get(pk=notification_id)
    hook = notification.webhook
    try:
        if hook is not None and not hook.active:
            raise DeliveryError("the webhook is disabled")
        if notification.channel == Channel.EMAIL:
            send_email(notification)
        elif hook is not None:
            post_webhook(notification, hook)
    except DeliveryError as exc:
        error = str(exc)
        done = timezone.now()
        last = notification.attempts >= int(notify_settings().get("MAX_ATTEMPTS", 6)) or (hook is not None and not hook.active)
        delay = None if last else _backoff_s(notification.attempts)
        Notification.objects.filter(pk=notification_id, state=DeliveryState.SENDING).update(
            state=DeliveryState.FAILED if last else DeliveryState.PENDING,
            last_error=error[:1000],
            next_attempt_at=None if delay is None else done + timedelta(seconds=delay),
        )
        log.info("notification %s: attempt %s failed: %s", notification_id, notification.attempts, error)
        if hook is not None and hook.active:
            _webhook_failed(hook, error, now=done)
            if not Webhook.objects.filter(pk=hook.pk, active=True).exists():
                return None
        return delay
    done = timezone.now()
    Notification.objects.filter(pk=notification_id).update(state=DeliveryState.SENT, sent_at=done, last_error="")
    if hook is not None:
        Webhook.objects.filter(pk=hook.pk).update(consecutive_failures=0, last_success_at=done)
    return None


# --------------------------------------------------------------------------- the in-portal list


def notifications_mark_read(*, user: User, ids: list[int], now: datetime) -> int:
    return Notification.objects.filter(user=user, channel=Channel.PORTAL, pk__in=ids, read_at__isnull=True).update(read_at=now)


# --------------------------------------------------------------------------- webhooks


def _clean_kinds(kinds: Iterable[str]) -> list[str]:
    chosen = sorted(set(kinds))
    wrong = [k for k in chosen if k not in CHOOSABLE]
    if wrong:
        raise ValidationError({"kinds": f"unknown event kind(s): {', '.join(wrong)}"})
    if not chosen:
        raise ValidationError({"kinds": "tick at least one event, or the webhook would never be called"})
    return chosen


@dataclass(frozen=True)
class CreatedWebhook:
    webhook: Webhook
    secret: str  # shown once on the page that answers the creation


@transaction.atomic
def webhook_create(*, actor: User, name: str, url: str, kinds: Iterable[str], team: OrgUnit | None) -> CreatedWebhook:
    """A personal webhook (team None) or a team's; the caller has checked the actor may manage the team's."""
    refused = check_webhook_url(url)
    if refused:
        raise ValidationError({"url": f"This URL cannot be used: {refused}"})
    if team is not None and team.kind != UnitKind.TEAM:
        raise ValidationError({"team": "Webhooks belong to a person or a team"})
    secret = "whsec_" + secrets.token_urlsafe(24)
    hook = Webhook.objects.create(
        user=None if team is not None else actor, team=team, created_by=actor, name=name.strip() or "webhook", url=url,
        secret=secret, kinds=_clean_kinds(kinds),
    )  # fmt: skip
    return CreatedWebhook(webhook=hook, secret=secret)


@transaction.atomic
def webhook_update(*, webhook: Webhook, kinds: Iterable[str]) -> Webhook:
    Webhook.objects.filter(pk=webhook.pk).update(kinds=_clean_kinds(kinds))
    webhook.refresh_from_db()
    return webhook


@transaction.atomic
def webhook_enable(*, webhook: Webhook) -> Webhook:
    """Switch a disabled webhook back on, with its failure count cleared."""
    Webhook.objects.filter(pk=webhook.pk).update(active=True, disabled_at=None, consecutive_failures=0)
    webhook.refresh_from_db()
    return webhook


@transaction.atomic
def webhook_delete(*, webhook: Webhook) -> None:
    webhook.delete()
