"""The sign-in page (local passwords and/or the SSO button) and the two OIDC endpoints.

Every way an SSO sign-in can go wrong ends on the sign-in page with a message that says what
happened and who can fix it: never a 500, never a bare 400 page.
"""

from __future__ import annotations

from typing import Any, cast
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect
from django.urls import reverse
from mozilla_django_oidc.utils import import_from_settings
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from sso.discovery import SsoUnavailable, provider_metadata, sso_settings


class LoginView(auth_views.LoginView):
    """Django's LoginView; with YARD_LOCAL_LOGIN=0 it shows only the SSO button and refuses passwords."""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        context = super().get_context_data(**kwargs)
        config = sso_settings()
        context.update(sso_enabled=config.enabled, sso_name=config.provider_name, local_login=config.local_login)
        return context

    def post(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not sso_settings().local_login:
            messages.error(request, "Passwords are switched off on this portal: sign in with single sign-on.")
            response = self.get(request, *args, **kwargs)
            response.status_code = 400
            return response
        return super().post(request, *args, **kwargs)


def _to_login(request: HttpRequest, message: str) -> HttpResponseRedirect:
    messages.error(request, message)
    return redirect("login")


class AuthenticateView(OIDCAuthenticationRequestView):  # type: ignore[misc]  # the library ships no types
    """Sends the browser to the provider (code flow with PKCE S256 and a nonce), endpoints from discovery."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # The parent reads the endpoint from settings at construction; it is found per request here.
        super(OIDCAuthenticationRequestView, self).__init__(*args, **kwargs)
        self.OIDC_RP_CLIENT_ID = sso_settings().client_id

    @staticmethod
    def get_settings(attr: str, *args: Any) -> Any:
        if attr == "OIDC_USE_PKCE":
            return True  # never off: a stolen code is worthless without the verifier (RFC 7636)
        return import_from_settings(attr, *args)

    def get(self, request: HttpRequest) -> HttpResponse:
        try:
            metadata = provider_metadata()
        except SsoUnavailable as exc:
            return _to_login(request, str(exc))
        self.OIDC_OP_AUTH_ENDPOINT = metadata.authorization_endpoint
        return cast(HttpResponse, super().get(request))


class CallbackView(OIDCAuthenticationCallbackView):  # type: ignore[misc]
    """The provider sends the browser back here with a code (or an error)."""

    @property
    def failure_url(self) -> str:
        return reverse("login")

    def login_success(self) -> HttpResponse:
        response = cast(HttpResponse, super().login_success())
        # Roles are re-read from the provider at each sign-in; a bounded session makes that happen
        # at least this often, so someone who left a group loses its access within the day.
        self.request.session.set_expiry(int(getattr(settings, "YARD_OIDC_SESSION_S", 12 * 3600)))
        return response

    def get(self, request: HttpRequest) -> HttpResponse:
        error = request.GET.get("error")
        if error:
            description = request.GET.get("error_description", "")
            super().get(request)  # forgets the state and signs out, as the library does
            if error == "access_denied":
                return _to_login(
                    request,
                    "Single sign-on was cancelled or refused by the identity provider"
                    + (f": {description}." if description else "."),
                )
            return _to_login(
                request, f"Single sign-on failed: the identity provider said {error}{f' ({description})' if description else ''}."
            )
        if "code" not in request.GET or "state" not in request.GET:
            return _to_login(
                request,
                "Single sign-on failed: the identity provider sent the browser back without a sign-in code. Please try again.",
            )
        if "oidc_states" not in request.session:
            return _to_login(request, "Your sign-in took too long or started in another browser; please sign in again.")
        try:
            return cast(HttpResponse, super().get(request))
        except SuspiciousOperation:
            return _to_login(
                request,
                "Your sign-in could not be matched to this browser (it may have started in another tab); please sign in again.",
            )


def admin_login(request: HttpRequest) -> HttpResponse:
    """The Django admin's password form, only while local passwords are on; else the portal's sign-in page."""
    from django.contrib import admin

    if sso_settings().local_login:
        return admin.site.login(request)
    return redirect(f"{reverse('login')}?{urlencode({'next': request.GET.get('next', '/admin/')})}")
