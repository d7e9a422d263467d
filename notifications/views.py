"""The notifications pages: the in-portal list, preferences, and webhook management."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from notifications.channels import email_enabled, notify_settings
from notifications.forms import PreferencesForm, WebhookForm, WebhookKindsForm
from notifications.kinds import Channel
from notifications.selectors import access_webhook, portal_notifications, preference_grid, webhooks_manageable
from notifications.services import (
    notifications_mark_read,
    preferences_set,
    webhook_create,
    webhook_delete,
    webhook_enable,
    webhook_update,
)
from portal.views.common import add_service_errors, signed_in
from tenants.selectors import teams_led

PAGE_SIZE = 50


@login_required
@require_http_methods(["GET"])
def notification_list(request: HttpRequest) -> HttpResponse:
    """The user's notifications, newest first; the ones on this page are marked read once shown."""
    user = signed_in(request)
    page = Paginator(portal_notifications(user=user), PAGE_SIZE).get_page(request.GET.get("page"))
    items = list(page.object_list)
    unread_ids = [n.pk for n in items if n.read_at is None]
    response = render(request, "notifications/list.html", {"page": page, "items": items, "unread_ids": set(unread_ids)})
    notifications_mark_read(user=user, ids=unread_ids, now=timezone.now())
    return response


def _channels() -> list[str]:
    return [Channel.PORTAL, Channel.EMAIL] if email_enabled() else [Channel.PORTAL]


@login_required
@require_http_methods(["GET", "POST"])
def preferences(request: HttpRequest) -> HttpResponse:
    user = signed_in(request)
    channels = _channels()
    form = PreferencesForm(request.POST or None, channels=channels, initial_grid=preference_grid(user=user, channels=channels))
    if request.method == "POST":
        if form.is_valid():
            preferences_set(user=user, choices=form.choices())
            messages.success(request, "Notification preferences saved.")
            return redirect("notification-preferences")
        return render(request, "notifications/preferences.html", {"form": form, "email_enabled": email_enabled()}, status=400)
    return render(request, "notifications/preferences.html", {"form": form, "email_enabled": email_enabled()})


@login_required
@require_http_methods(["GET", "POST"])
def webhooks(request: HttpRequest) -> HttpResponse:
    user = signed_in(request)
    led = teams_led(user=user)
    form = WebhookForm(request.POST or None, led=led)
    secret = None
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            created = webhook_create(actor=user, name=data["name"], url=data["url"], kinds=data["kinds"], team=data["team"])
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            secret = created.secret
            form = WebhookForm(led=led)
    status = 400 if request.method == "POST" and secret is None else 200
    hooks = [
        (hook, WebhookKindsForm(initial={"kinds": hook.kinds}, prefix=f"hook{hook.pk}"))
        for hook in webhooks_manageable(user=user)
    ]
    context = {
        "form": form,
        "hooks": hooks,
        "secret": secret,
        "disable_after": notify_settings().get("WEBHOOK_DISABLE_AFTER", 10),
    }
    return render(request, "notifications/webhooks.html", context, status=status)


@login_required
@require_POST
def webhook_edit(request: HttpRequest, pk: int) -> HttpResponse:
    hook = access_webhook(user=signed_in(request), pk=pk)
    form = WebhookKindsForm(request.POST, prefix=f"hook{hook.pk}")
    if not form.is_valid():
        messages.error(request, f"{hook.name}: tick at least one event, or delete the webhook.")
        return redirect("webhooks")
    try:
        webhook_update(webhook=hook, kinds=form.cleaned_data["kinds"])
    except ValidationError as exc:
        messages.error(request, f"{hook.name}: {' '.join(exc.messages)}")
    else:
        messages.success(request, f"{hook.name}: events saved.")
    return redirect("webhooks")


@login_required
@require_POST
def webhook_enable_view(request: HttpRequest, pk: int) -> HttpResponse:
    hook = webhook_enable(webhook=access_webhook(user=signed_in(request), pk=pk))
    messages.success(request, f"{hook.name} is enabled again.")
    return redirect("webhooks")


@login_required
@require_POST
def webhook_delete_view(request: HttpRequest, pk: int) -> HttpResponse:
    hook = access_webhook(user=signed_in(request), pk=pk)
    webhook_delete(webhook=hook)
    messages.success(request, f"{hook.name} deleted.")
    return redirect("webhooks")
