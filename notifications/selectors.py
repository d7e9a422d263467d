"""Reads of the notifications app, with the ownership check built in (404 for anyone else's)."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Q, QuerySet
from django.http import Http404

from notifications.kinds import CHOOSABLE, DEFAULTS, Channel
from notifications.models import Notification, Preference, Webhook
from tenants.selectors import teams_led


def unread_count(*, user: User | AnonymousUser) -> int:
    if not user.is_authenticated:
        return 0
    return Notification.objects.filter(user=user, channel=Channel.PORTAL, read_at__isnull=True).count()


def portal_notifications(*, user: User) -> QuerySet[Notification]:
    return Notification.objects.filter(user=user, channel=Channel.PORTAL).select_related("event").order_by("-created_at", "-id")


def webhooks_manageable(*, user: User) -> QuerySet[Webhook]:
    """The user's own webhooks and those of the teams they lead (leads, org and cluster admins)."""
    return Webhook.objects.filter(Q(user=user) | Q(team__in=teams_led(user=user))).select_related("team").order_by("name", "id")


def access_webhook(*, user: User, pk: int) -> Webhook:
    try:
        return webhooks_manageable(user=user).get(pk=pk)
    except Webhook.DoesNotExist:
        raise Http404("No such webhook") from None


def preference_grid(*, user: User, channels: list[str]) -> dict[tuple[str, str], bool]:
    """(kind, channel) -> on/off for every choosable kind, the defaults filled in."""
    stored = {(p.kind, p.channel): p.enabled for p in Preference.objects.filter(user=user)}
    return {(k, c): stored.get((k, c), k in DEFAULTS[c]) for k in CHOOSABLE for c in channels}
