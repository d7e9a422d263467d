"""Small helpers the portal's views share."""

from __future__ import annotations

from typing import cast

from django import forms
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.http import HttpRequest

# Team colours on the cluster map and quota bars: a fixed palette, picked by team id so a team keeps
# its colour from page to page (Okabe-Ito plus a few, readable for colour-blind people).
TEAM_PALETTE = (
    "#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#8c6d31", "#6a3d9a", "#b15928", "#1b9e77",
)  # fmt: skip


def team_colour(team_id: int | None) -> str:
    return "#9ca3af" if team_id is None else TEAM_PALETTE[team_id % len(TEAM_PALETTE)]


def partial(request: HttpRequest, template: str, name: str) -> str:
    """The page's template, or only its ``name`` fragment when htmx asks (one URL serves both)."""
    return f"{template}#{name}" if getattr(request, "htmx", False) else template


def add_service_errors(form: forms.Form, error: ValidationError) -> None:
    """Put a service's ValidationError on the form: keyed messages next to their field, the rest on top."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error.messages)
        return
    for key, messages in error.message_dict.items():
        form.add_error(key if key in form.fields else None, messages)


def signed_in(request: HttpRequest) -> User:
    """The request's user, in views behind @login_required (so never anonymous)."""
    return cast(User, request.user)
