"""Source events, the outbox of deliveries (which is also the in-portal list), preferences and webhooks.

The database keeps "exactly one": an Event is unique by the row it came from (``key``), and a
Notification is unique per event and recipient user and channel, or per event and webhook.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from notifications.kinds import Channel, Kind
from tenants.models import OrgUnit


class Watermark(models.Model):
    """How far a collector has read a source table (its rows' ids); locked while it reads."""

    name = models.CharField(max_length=32, primary_key=True)
    last_id = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} @ {self.last_id}"


class Event(models.Model):
    # "jobevent:<id>", "audit:<id>", "near-limit:<job>:<attempt>", "webhook-disabled:<id>:<n>"
    key = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=20, choices=Kind.choices)
    time = models.DateTimeField(default=timezone.now)
    job = models.ForeignKey("scheduling.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    team = models.ForeignKey(OrgUnit, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    link = models.CharField(max_length=255, blank=True, help_text="Path in the portal, e.g. /jobs/42/")
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-time", "-id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.title}"


class Webhook(models.Model):
    """A URL that receives JSON (Slack/Mattermost/Teams "text" payloads), HMAC-SHA256 signed.

    Personal (``user``: the owner's own jobs) or a team's (``team``: every job of the team and its quota).
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="webhooks")
    team = models.ForeignKey(OrgUnit, null=True, blank=True, on_delete=models.CASCADE, related_name="webhooks")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=100)
    url = models.URLField(max_length=1000)
    secret = models.CharField(max_length=100)
    kinds = models.JSONField(default=list, blank=True)
    active = models.BooleanField(default=True)
    consecutive_failures = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(user__isnull=False) & Q(team__isnull=True)) | (Q(user__isnull=True) & Q(team__isnull=False)),
                name="webhook_personal_or_team",
            )
        ]

    def __str__(self) -> str:
        return self.name


class DeliveryState(models.TextChoices):
    PENDING = "PENDING", "Pending"
    SENDING = "SENDING", "Sending"
    SENT = "SENT", "Sent"
    FAILED = "FAILED", "Failed"


class Notification(models.Model):
    """One event for one recipient on one channel: an in-portal item, an e-mail or a webhook call."""

    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="notifications")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    channel = models.CharField(max_length=8, choices=Channel.choices)
    webhook = models.ForeignKey(Webhook, null=True, blank=True, on_delete=models.CASCADE, related_name="deliveries")
    state = models.CharField(max_length=8, choices=DeliveryState.choices, default=DeliveryState.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    sent_at = models.DateTimeField(null=True, blank=True)
    read_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["event", "user", "channel"],
                condition=Q(webhook__isnull=True),
                name="notification_one_per_event_user_channel",
            ),
            models.UniqueConstraint(
                fields=["event", "webhook"], condition=Q(webhook__isnull=False), name="notification_one_per_event_webhook"
            ),
            models.CheckConstraint(
                condition=Q(channel=Channel.WEBHOOK, webhook__isnull=False)
                | (~Q(channel=Channel.WEBHOOK) & Q(webhook__isnull=True)),
                name="notification_webhook_channel_has_webhook",
            ),
        ]
        indexes = [
            models.Index(fields=["user", "channel", "read_at"]),
            models.Index(fields=["state", "next_attempt_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.event_id} → {self.user_id or self.webhook_id}"


class Preference(models.Model):
    """A user's choice for one kind on one channel (no row: the default in notifications.kinds)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="notification_preferences")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    enabled = models.BooleanField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "kind", "channel"], name="preference_unique_user_kind_channel")]

    def __str__(self) -> str:
        return f"{self.user_id} {self.kind}/{self.channel}: {'on' if self.enabled else 'off'}"
