"""Fair share for every member: where each of my teams stands, level by level, and what would change it."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from scheduling.governance.fairshare import fairshare_explain, fairshare_teams
from tenants.selectors import teams_visible


@login_required
@require_GET
def fairshare_page(request: HttpRequest) -> HttpResponse:
    teams = fairshare_teams(user=request.user, team=request.GET.get("team", "").strip())
    report = fairshare_explain(teams=teams, now=timezone.now())
    return render(
        request,
        "portal/fairshare.html",
        {"report": report, "choices": teams_visible(user=request.user).order_by("path"), "selected": request.GET.get("team", "")},
    )
