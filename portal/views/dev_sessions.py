"""Dev sessions (docs/dev-sessions.md): launch one, follow it from queued to running, connect to it with
`yard ssh`, extend its idle timeout, stop it. A notebook's pages with SSH in place of Jupyter.

URLs. ``/dev-sessions/<id>/ssh`` is the SSH tunnel's (portal/dev_proxy.py, a websocket on the ASGI server),
so the pages are ``/dev-sessions/`` (list), ``/dev-sessions/new`` (launch) and ``/dev-sessions/<id>/`` (the
session), and the actions on a session are POSTs to its page with ``action=stop`` or ``action=extend``, as
the services' pages do: no page path of ours comes near the tunnel's.
"""

from __future__ import annotations

import math

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBadRequest, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from portal.forms import DevSessionForm
from portal.views.common import add_service_errors, signed_in
from portal.views.jobs import _after_action, default_gpu_type, render_live
from portal.views.notebooks import ended_as, idle_activity
from scheduling.api.serializers import dev_ssh
from scheduling.governance.reaper import job_extend_idle, policy_for
from scheduling.models import Job, JobKind, Task, Tier
from scheduling.selectors import access_job, access_job_manage, can_manage_job, jobs_visible
from scheduling.services import JobSpec, job_cancel, job_submit
from scheduling.states import TERMINAL_STATES, JobState, TaskState
from tenants.models import OrgUnit
from tenants.selectors import ssh_keys_of, teams_submittable

RECENT = 20


def _dev_session(request: HttpRequest, pk: int) -> Job:
    job = access_job(user=request.user, pk=pk)
    if job.kind != JobKind.DEV:
        raise Http404("No such dev session")
    return job


def _timeout_min(teams: QuerySet[OrgUnit]) -> int | None:
    """The idle timeout the first of the person's teams has, in minutes, for the launch page's words."""
    first = teams.first()
    policy = policy_for(team=first, tier=Tier.RESEARCH) if first is not None else None
    return math.ceil(policy.timeout_s / 60) if policy else None


@login_required
@require_GET
def dev_sessions(request: HttpRequest) -> HttpResponse:
    user = signed_in(request)
    mine = jobs_visible(user=user).filter(user_id=user.pk, kind=JobKind.DEV).select_related("team")
    mine = mine.order_by("-submitted_at")[:RECENT]
    context = {
        "sessions": mine,
        "has_keys": ssh_keys_of(user=user).exists(),
        "timeout_min": _timeout_min(teams_submittable(user=user)),
    }
    return render(request, "portal/dev_sessions.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def dev_session_new(request: HttpRequest) -> HttpResponse:
    user = signed_in(request)
    teams = teams_submittable(user=user)
    gpu_type = default_gpu_type(teams)
    form = DevSessionForm(request.POST or None, teams=teams, initial={"gpu_type": gpu_type} if gpu_type else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        hours = data.get("time_limit_h")
        spec = JobSpec(
            name=f"dev-{user.get_username()}",
            team=data["team"],
            tier=data["tier"],
            kind=JobKind.DEV,
            gpus_per_replica=data["gpus"],
            gpu_type=data["gpu_type"],
            time_limit_s=round(hours * 3600) if hours else None,
            image=data.get("image") or "",
        )
        try:
            job = job_submit(user=user, spec=spec)
            return HttpResponseRedirect(reverse("dev-session", args=[job.pk]))
        except ValidationError as error:
            if hasattr(error, "error_dict"):
                if "gpus_per_replica" in error.error_dict:
                    error.error_dict["gpus"] = error.error_dict.pop("gpus_per_replica")
                if "time_limit_s" in error.error_dict:
                    error.error_dict["time_limit_h"] = error.error_dict.pop("time_limit_s")
            add_service_errors(form, error)
    context = {
        "form": form,
        "has_keys": ssh_keys_of(user=user).exists(),
        "timeout_min": _timeout_min(teams),
    }
    return render(request, "portal/dev_session_new.html", context, status=400 if request.method == "POST" else 200)


def _stop(request: HttpRequest, job: Job) -> HttpResponse:
    job = access_job_manage(user=request.user, pk=job.pk)  # 404 for who may only look
    if not job.is_terminal:
        job_cancel(job=job, actor=signed_in(request))  # the page says "Stopping" until it has stopped
    return _after_action(request, reverse("dev-session", args=[job.pk]))


def _extend(request: HttpRequest, job: Job) -> HttpResponse:
    if job.user_id != request.user.pk:
        raise PermissionDenied("Only the dev session's owner can extend its idle timeout")
    try:
        job_extend_idle(job=job, user=signed_in(request), now=timezone.now())
        messages.success(request, f"{job.name}: idle timeout extended")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    target = request.POST.get("next", "")
    safe = target.startswith("/") and not target.startswith("//")
    return _after_action(request, target if safe else reverse("dev-session", args=[job.pk]))


ACTIONS = {"stop": _stop, "extend": _extend}


@login_required
@require_http_methods(["GET", "POST"])
def dev_session_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = _dev_session(request, pk)
    if request.method == "POST":
        action = ACTIONS.get(request.POST.get("action", ""))
        if action is None:
            return HttpResponseBadRequest("Unknown action: stop or extend")
        return action(request, job)
    task = (
        Task.objects.filter(job=job, attempt=job.attempt, rank=0).select_related("node").first()
        if job.state in (JobState.STARTING, JobState.RUNNING)
        else None
    )
    running = task is not None and job.state == JobState.RUNNING and task.state == TaskState.RUNNING
    is_owner = job.user_id == request.user.pk
    context = {
        "job": job,
        "task": task,
        "is_owner": is_owner,
        "can_manage": can_manage_job(user=request.user, job=job),
        "terminal_states": [s.value for s in TERMINAL_STATES],
        "activity": idle_activity(job),
        "state_label": ended_as(job),
        # How to connect, once its sshd has said where it listens (the API's ssh object, the same words).
        "ssh": dev_ssh(job, task) if running and task is not None and task.dev_endpoint else None,
        "has_keys": ssh_keys_of(user=request.user).exists() if is_owner else True,
    }
    return render_live(request, "portal/dev_session_detail.html", context, terminal=job.is_terminal)


def dev_session_tunnel_elsewhere(request: HttpRequest, pk: int) -> HttpResponse:
    """/dev-sessions/<id>/ssh reached the WSGI web tier: the SSH tunnel is the ASGI server's (portal/dev_proxy.py).
    Say what to route; `yard ssh` reads the tunnel's URL from the API, which names the ASGI server."""
    return JsonResponse(
        {
            "code": "proxy_not_routed",
            "message": "The SSH tunnel is served by the portal's ASGI server (uvicorn portal.asgi:application), and this "
            "request reached the web server instead: route /dev-sessions/<id>/ssh (websockets) to it in the reverse "
            'proxy, or set YARD_NOTEBOOK_URL to where it listens. See the README, "Dev sessions: SSH and VS Code".',
        },
        status=502,
    )
