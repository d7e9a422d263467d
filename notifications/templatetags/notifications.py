"""{% unread_notifications %}: the unread count beside "Notifications" in the nav (one COUNT per page)."""

from __future__ import annotations

from typing import Any

from django import template

from notifications.selectors import unread_count

register = template.Library()


@register.simple_tag(takes_context=True)
def unread_notifications(context: dict[str, Any]) -> int:
    user = context.get("user")
    return unread_count(user=user) if user is not None else 0
