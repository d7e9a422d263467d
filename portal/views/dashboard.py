from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.selectors import teams_visible, user_roles


@login_required
def dashboard(request: HttpRequest) -> HttpResponse:
    return render(
        request,
        "portal/dashboard.html",
        {"teams": teams_visible(user=request.user), "roles": user_roles(user=request.user)},
    )
