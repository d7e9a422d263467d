"""What a person locked out of signing in sees (django-axes' AXES_LOCKOUT_CALLABLE): the sign-in page
with a message that says why and for how long, answered 429; JSON for a script."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.core.exceptions import NON_FIELD_ERRORS
from django.forms.utils import ErrorDict
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from sso.discovery import sso_settings


def cooloff_minutes() -> int:
    return max(1, math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60))


def locked_out(request: HttpRequest, original_response: HttpResponse | None = None, credentials: Any = None) -> HttpResponse:
    minutes = cooloff_minutes()
    retry_after = minutes * 60
    message = (
        f"Too many failed sign-ins for this account from your address: signing in is blocked for {minutes} minutes "
        "from the last attempt. Check the username, wait, and try again; a cluster admin can lift the block "
        "(manage.py axes_reset_username USERNAME)."
    )
    address_wait = getattr(request, "yard_address_wait", None)
    if address_wait is not None:  # across usernames, from this address (tenants/lockout.py)
        retry_after = int(address_wait)
        message = (
            "Too many failed sign-ins from your address, across accounts: signing in from it is blocked for "
            f"{max(1, math.ceil(retry_after / 60))} more minutes. Other addresses are not affected."
        )
    if request.path.startswith("/api/") or request.headers.get("Accept", "").startswith("application/json"):
        response: HttpResponse = JsonResponse({"code": "locked_out", "message": message, "fields": {}}, status=429)
    else:
        # Unbound (with the username kept): a bound form would authenticate again while it validates,
        # and every such attempt during the lockout restarts the cool-off.
        form = AuthenticationForm(request, initial={"username": request.POST.get("username", "")[:150]})
        errors = ErrorDict({NON_FIELD_ERRORS: form.error_class([message], error_class="nonfield")})
        form._errors = errors  # type: ignore[attr-defined]
        config = sso_settings()
        context = {
            "form": form,
            "next": request.POST.get("next", ""),
            "sso_enabled": config.enabled,
            "sso_name": config.provider_name,
            "local_login": config.local_login,
        }
        response = render(request, "registration/login.html", context, status=429)
    response["Retry-After"] = str(retry_after)
    return response
