"""API tokens: personal ones for the signed-in user, service-account ones for the teams they lead.

The raw token is shown once, on the page that answers its creation; only its hash is stored.
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Q
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from portal.views.common import add_service_errors, signed_in
from tenants.models import ApiToken, OrgUnit, TokenKind
from tenants.selectors import teams_led
from tenants.services import token_create_personal, token_create_service, token_revoke

MAX_DAYS = 365


class TokenForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What it is for, e.g. “laptop” or “gitlab-ci”")
    team = forms.ModelChoiceField(
        queryset=OrgUnit.objects.none(),
        required=False,
        empty_label="— personal token (acts as you) —",
        help_text="Pick a team you lead to make a service-account token for its CI",
    )
    expires_in_days = forms.IntegerField(min_value=1, max_value=MAX_DAYS, initial=90, label="Expires in (days)")

    def __init__(self, *args: object, led: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.fields["team"].queryset = led  # type: ignore[attr-defined]


def _visible_tokens(request: HttpRequest) -> list[ApiToken]:
    user = signed_in(request)
    query = Q(kind=TokenKind.PERSONAL, user=user) | Q(kind=TokenKind.SERVICE, team__in=teams_led(user=user))
    return list(ApiToken.objects.filter(query).select_related("team").order_by("-created_at"))


@login_required
@require_http_methods(["GET", "POST"])
def tokens(request: HttpRequest) -> HttpResponse:
    user = signed_in(request)
    led = teams_led(user=user)
    form = TokenForm(request.POST or None, led=led)
    raw = None
    if request.method == "POST" and form.is_valid():
        expires = timezone.now() + timedelta(days=form.cleaned_data["expires_in_days"])
        team = form.cleaned_data["team"]
        try:
            if team is None:
                issued = token_create_personal(user=user, name=form.cleaned_data["name"], expires_at=expires)
            else:
                issued = token_create_service(actor=user, team=team, name=form.cleaned_data["name"], expires_at=expires)
        except ValidationError as exc:
            add_service_errors(form, exc)
        else:
            raw = issued.raw
            form = TokenForm(led=led)
    status = 400 if request.method == "POST" and raw is None else 200
    context = {"form": form, "tokens": _visible_tokens(request), "raw": raw, "now": timezone.now()}
    return render(request, "portal/tokens.html", context, status=status)


@login_required
@require_POST
def token_revoke_view(request: HttpRequest, pk: int) -> HttpResponse:
    token = next((t for t in _visible_tokens(request) if t.pk == pk), None)
    if token is None:
        raise Http404("No such token")
    token_revoke(actor=signed_in(request), token=token)
    return redirect("tokens")
