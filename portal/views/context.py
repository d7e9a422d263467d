"""Template context every page gets: the signed-in user's teams and roles.

Lazy, so a page that never shows them (the login page, an htmx fragment) costs no query;
the memberships are read once per request (tenants.selectors caches them on the user).
"""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from scheduling.governance.reaper import idle_warnings_for
from tenants.models import Role
from tenants.selectors import admin_roots, is_cluster_admin, teams_visible, user_roles


def _summary(request: HttpRequest) -> dict[str, Any]:
    user = request.user
    roles = user_roles(user=user)
    return {
        "teams": list(teams_visible(user=user)),
        "roles": [(unit, Role(role).label) for unit, role in roles],
        "is_cluster_admin": is_cluster_admin(user),
        "can_edit_quotas": bool(admin_roots(user=user)),
    }


def yard(request: HttpRequest) -> dict[str, Any]:
    """Registered in settings.TEMPLATES as portal.views.context.yard."""
    user = getattr(request, "user", None)  # absent on requests that skipped the auth middleware
    if user is None or not user.is_authenticated:
        return {}
    return {
        "yard": SimpleLazyObject(lambda: _summary(request)),
        # The idle reaper's warnings: a banner on every page of the notebook's owner.
        "idle_warnings": SimpleLazyObject(lambda: idle_warnings_for(user)),
    }
