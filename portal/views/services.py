"""Inference services (docs/services.md): the list, a new one, its page (live by htmx polling), and what its
managers may do there: scale, roll out a new release, roll back, make and revoke endpoint tokens, delete.

URLs. ``/services/<team>/<name>/…`` belongs to the service proxy (portal/service_proxy.py, PATH), and a team
slug may be all digits, so no page of ours may have a path of the shape ``/services/<x>/<y>``: the pages are
``/services/`` (list), ``/services/new`` (create) and ``/services/<pk>/`` (detail). Each action on a service is
a POST to that same detail URL with ``action=<name>``: ``/services/<pk>/scale`` would be the proxy's path of a
service called "scale" in a team whose slug is ``<pk>``. Each action is still one small function below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from portal.forms import (
    ServiceForm,
    ServiceRollbackForm,
    ServiceRolloutForm,
    ServiceScaleForm,
    ServiceTokenForm,
    format_env,
)
from portal.notebook_proxy import notebook_public_url
from portal.views.common import add_service_errors, partial, signed_in
from portal.views.jobs import POLL_STOP, _after_action, default_gpu_type
from scheduling.models import Service, ServiceState, ServiceToken
from scheduling.selectors import task_log_tail
from scheduling.serving.selectors import (
    Replica,
    ServiceStats,
    access_service,
    can_manage_service,
    replicas_of,
    rollout_progress,
    service_stats,
    services_visible,
)
from scheduling.serving.services import (
    ServiceSpec,
    service_create,
    service_delete,
    service_rollback,
    service_scale,
    service_token_create,
    service_token_revoke,
    service_update,
)
from scheduling.states import JobState
from tenants.selectors import teams_submittable

STATS_SECONDS = 60.0
LOG_LINES = 15  # of a crash-looping replica, on its page
LIST_MAX = 300


@dataclass(frozen=True)
class ReplicaRow:
    """A replica as its service's page shows it."""

    replica: Replica
    rps: float
    log: str  # the last lines of rank 0's log, for a crash-looping replica only

    @property
    def job(self) -> Any:
        return self.replica.job

    @property
    def node(self) -> str:
        task = self.replica.task
        return task.node.name if task is not None and task.node_id else ""

    @property
    def message(self) -> str:
        return self.replica.task.service_message if self.replica.task is not None else ""

    @property
    def status(self) -> str:
        """One word for the replica: ready, starting, draining, stopping, crash-looping, pending."""
        r = self.replica
        if r.stopping:
            return "stopping"
        if r.draining:
            return "draining"
        if r.crash_looping:
            return "crash-looping"
        if r.ready:
            return "ready"
        return "pending" if r.job.state == JobState.PENDING else "not ready"

    @property
    def pending_reason(self) -> str:
        return self.replica.job.pending_reason if self.replica.job.state == JobState.PENDING else ""

    @property
    def starting(self) -> bool:
        """Pending but about to be placed (as the job page says it): no reason to wait was given."""
        reason = self.pending_reason
        return not reason or reason.startswith(("queued", "fits now", "requeued"))

    @property
    def estimated_start(self) -> datetime | None:
        return self.replica.job.estimated_start if self.replica.job.state == JobState.PENDING else None


@dataclass(frozen=True)
class ServiceLine:
    """A service in the list: what it wants and has, and what the proxy measured over the last minute."""

    service: Service
    ready: int
    rollout: dict[str, Any]
    stats: ServiceStats


def endpoint_url(request: HttpRequest, service: Service) -> str:
    """Where callers reach the service: the portal's ASGI server (YARD_NOTEBOOK_URL where it listens apart)."""
    base = notebook_public_url() or request.build_absolute_uri("/").rstrip("/")
    return f"{base}/services/{service.team.slug}/{service.name}/"


# --------------------------------------------------------------------------- list and create


@login_required
def services_list(request: HttpRequest) -> HttpResponse:
    services = services_visible(user=request.user).select_related("team", "user").order_by("team__slug", "name")
    lines = []
    for service in services[:LIST_MAX]:
        replicas = replicas_of(service=service)
        lines.append(
            ServiceLine(
                service=service,
                ready=sum(1 for r in replicas if r.ready),
                rollout=rollout_progress(service=service, replicas=replicas),
                stats=service_stats(service=service, seconds=STATS_SECONDS),
            )
        )
    return render(request, "portal/services.html", {"lines": lines, "stats_seconds": int(STATS_SECONDS)})


@login_required
@require_http_methods(["GET", "POST"])
def service_new(request: HttpRequest) -> HttpResponse:
    teams = teams_submittable(user=request.user)
    if request.method != "POST":
        initial: dict[str, Any] = {}
        if gpu_type := default_gpu_type(teams):
            initial["gpu_type"] = gpu_type
        return render(request, "portal/service_new.html", {"form": ServiceForm(initial=initial, teams=teams)})
    form = ServiceForm(request.POST, teams=teams)
    if form.is_valid():
        try:
            service = service_create(user=signed_in(request), spec=ServiceSpec(**form.spec_kwargs()))
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Created service {service}: its replicas queue like any job")
            return HttpResponseRedirect(reverse("service", args=[service.pk]))
    return render(request, "portal/service_new.html", {"form": form}, status=400)


# --------------------------------------------------------------------------- the service's page


def _live_context(request: HttpRequest, service: Service) -> dict[str, Any]:
    replicas = replicas_of(service=service)
    stats = service_stats(service=service, seconds=STATS_SECONDS)
    rows = []
    for r in replicas:
        log = task_log_tail(task=r.task, lines=LOG_LINES)[0] if r.crash_looping and r.task is not None else ""
        rows.append(ReplicaRow(replica=r, rps=stats.per_replica.get(r.job.pk, {}).get("rps", 0.0), log=log))
    return {
        "service": service,
        "rows": rows,
        "ready": sum(1 for r in replicas if r.ready),
        "rollout": rollout_progress(service=service, replicas=replicas),
        "stats": stats,
        "stats_seconds": int(STATS_SECONDS),
        "deleting": service.state != ServiceState.ACTIVE,
    }


def _earlier_revisions(service: Service) -> list[tuple[int, str]]:
    revisions = service.revisions.exclude(number=service.revision).order_by("-number")
    return [(r.number, f"revision {r.number}: {r.image or (r.command[:60] or '—')}") for r in revisions]


def _page(
    request: HttpRequest,
    service: Service,
    *,
    bound: dict[str, forms.Form] | None = None,
    raw_token: ServiceToken | None = None,
    raw: str = "",
    status: int = 200,
) -> HttpResponse:
    """The page (or, for htmx, its live fragment), with the managers' forms: those given bound (with their
    errors), the others fresh."""
    context = _live_context(request, service)
    manage = can_manage_service(user=request.user, service=service) and service.state == ServiceState.ACTIVE
    context.update({"endpoint": endpoint_url(request, service), "can_manage": manage})
    revision = service.revisions.filter(number=service.revision).first()
    context["current"] = revision
    if manage and not getattr(request, "htmx", False):
        bound = bound or {}
        release = {
            "image": revision.image if revision else "",
            "command": revision.command if revision else "",
            "env": format_env(revision.env or {}) if revision else "",
        }
        context.update(
            {
                "scale_form": bound.get("scale") or ServiceScaleForm(prefix="scale", initial={"replicas": service.replicas}),
                "rollout_form": bound.get("rollout") or ServiceRolloutForm(prefix="rollout", initial=release),
                "rollback_form": bound.get("rollback")
                or ServiceRollbackForm(prefix="rollback", revisions=_earlier_revisions(service)),
                "token_form": bound.get("token") or ServiceTokenForm(prefix="token"),
                "tokens": list(service.tokens.order_by("-created_at")),
                "new_token": raw_token,
                "raw": raw,
            }
        )
    response = render(request, partial(request, "portal/service_detail.html", "live"), context, status=status)
    return response


def _gone(request: HttpRequest) -> HttpResponse:
    """The live fragment of a service that is no more (deleted, or never visible): polling stops. The
    same answer for any id, so it says nothing of other tenants' services."""
    return render(request, "portal/service_detail.html#gone", {}, status=POLL_STOP)


@login_required
@require_http_methods(["GET", "POST"])
def service_detail(request: HttpRequest, pk: int) -> HttpResponse:
    try:
        service = access_service(user=request.user, pk=pk)
    except Http404:
        if getattr(request, "htmx", False) and request.method == "GET":
            return _gone(request)
        raise
    if request.method == "GET":
        return _page(request, service)
    if not can_manage_service(user=request.user, service=service):
        raise PermissionDenied("Only the service's owner, its team's members and lead, or an admin above the team may change it")
    action = ACTIONS.get(request.POST.get("action", ""))
    if action is None:
        return HttpResponseBadRequest("Unknown action: scale, rollout, rollback, token, revoke or delete")
    return action(request, service)


def _done(request: HttpRequest, service: Service, message: str) -> HttpResponse:
    messages.success(request, message)
    return _after_action(request, reverse("service", args=[service.pk]))


def _refused(request: HttpRequest, service: Service, name: str, form: forms.Form, error: ValidationError) -> HttpResponse:
    add_service_errors(form, error)
    return _page(request, service, bound={name: form}, status=400)


def _scale(request: HttpRequest, service: Service) -> HttpResponse:
    form = ServiceScaleForm(request.POST, prefix="scale")
    if not form.is_valid():
        return _page(request, service, bound={"scale": form}, status=400)
    try:
        service = service_scale(user=signed_in(request), service=service, replicas=form.cleaned_data["replicas"])
    except ValidationError as error:
        return _refused(request, service, "scale", form, error)
    return _done(request, service, f"Scaled {service.name} to {service.replicas} replica{'s' * (service.replicas != 1)}")


def _rollout(request: HttpRequest, service: Service) -> HttpResponse:
    form = ServiceRolloutForm(request.POST, prefix="rollout")
    if not form.is_valid():
        return _page(request, service, bound={"rollout": form}, status=400)
    changes = {k: form.cleaned_data[k] for k in ("image", "command", "env")}
    current = service.revisions.filter(number=service.revision).first()
    if current is not None and changes == {"image": current.image, "command": current.command, "env": current.env or {}}:
        form.add_error(None, "Nothing changed: change the image, the command or the environment to roll out a new revision")
        return _page(request, service, bound={"rollout": form}, status=400)
    try:
        service = service_update(user=signed_in(request), service=service, changes=changes)
    except ValidationError as error:
        return _refused(request, service, "rollout", form, error)
    return _done(request, service, f"Rolling out revision {service.revision}, replica by replica")


def _rollback(request: HttpRequest, service: Service) -> HttpResponse:
    form = ServiceRollbackForm(request.POST, prefix="rollback", revisions=_earlier_revisions(service))
    if not form.is_valid():
        return _page(request, service, bound={"rollback": form}, status=400)
    target = form.cleaned_data["to_revision"]
    try:
        service = service_rollback(user=signed_in(request), service=service, to_revision=target)
    except ValidationError as error:
        return _refused(request, service, "rollback", form, error)
    return _done(request, service, f"Rolling back: revision {service.revision} runs revision {target}'s release")


def _token_create(request: HttpRequest, service: Service) -> HttpResponse:
    form = ServiceTokenForm(request.POST, prefix="token")
    if not form.is_valid():
        return _page(request, service, bound={"token": form}, status=400)
    try:
        token, raw = service_token_create(user=signed_in(request), service=service, name=form.cleaned_data["name"])
    except ValidationError as error:
        return _refused(request, service, "token", form, error)
    # The one time the token is shown: in this answer, never behind a redirect (only its hash is kept).
    return _page(request, service, raw_token=token, raw=raw)


def _token_revoke(request: HttpRequest, service: Service) -> HttpResponse:
    token_id = request.POST.get("token", "")
    token = service.tokens.filter(pk=int(token_id)).first() if token_id.isdigit() else None
    if token is None:
        raise Http404("No such token of this service")
    service_token_revoke(user=signed_in(request), token=token)
    return _done(request, service, f"Revoked token {token}")


def _delete(request: HttpRequest, service: Service) -> HttpResponse:
    service = service_delete(user=signed_in(request), service=service)
    messages.success(request, f"Deleting {service}: its replicas are drained and stopped, its tokens revoked")
    return _after_action(request, reverse("services"))


ACTIONS: dict[str, Callable[[HttpRequest, Service], HttpResponse]] = {
    "scale": _scale,
    "rollout": _rollout,
    "rollback": _rollback,
    "token": _token_create,
    "revoke": _token_revoke,
    "delete": _delete,
}


def service_elsewhere(request: HttpRequest, team: str, name: str, rest: str = "") -> HttpResponse:
    """/services/<team>/<name>/… reached the WSGI web tier: the service proxy (the ASGI server) serves it.

    Where that lives on another address (YARD_NOTEBOOK_URL; `make run`: port 8001) the caller is sent there
    with a 307 (its method and body kept); otherwise the reverse proxy does not route the path to it, and the
    answer says what to change (JSON: the callers are programs)."""
    target = notebook_public_url()
    if target:
        query = request.META.get("QUERY_STRING", "")
        response = HttpResponse(status=307)  # a 302 would turn a POST into a GET
        response["Location"] = f"{target}/services/{team}/{name}/{rest}" + (f"?{query}" if query else "")
        return response
    return JsonResponse(
        {
            "code": "proxy_not_routed",
            "message": "Services are served by the portal's ASGI server (uvicorn portal.asgi:application), and this "
            "request reached the web server instead: route /services/ to it in the reverse proxy, or set "
            'YARD_NOTEBOOK_URL to where it listens. See the README, "Inference services".',
        },
        status=502,
    )
