"""Notebooks: launch one, follow it from queued to running, open it (owner only), stop it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.forms import NotebookForm
from portal.notebook_access import can_open_notebook, server_url
from portal.notebook_proxy import notebook_public_url
from portal.views.common import add_service_errors, signed_in
from portal.views.jobs import _after_action, default_gpu_type, render_live
from scheduling.governance.reaper import idle_seconds, policy_for, reap_at
from scheduling.models import Job, JobKind, Task, Tier
from scheduling.selectors import access_job, access_job_manage, can_manage_job, jobs_visible
from scheduling.services import JobSpec, job_cancel, job_submit
from scheduling.states import TERMINAL_STATES, JobState
from tenants.selectors import teams_submittable

RECENT = 10


def _notebook(request: HttpRequest, pk: int) -> Job:
    job = access_job(user=request.user, pk=pk)
    if job.kind != JobKind.NOTEBOOK:
        raise Http404("No such notebook")
    return job


def notebook_lab_url(job: Job) -> str:
    """Where a browser opens the notebook: the portal's notebook proxy (portal/notebook_proxy.py), never the node."""
    return f"{notebook_public_url()}/notebooks/{job.pk}/lab/"


@login_required
def notebooks(request: HttpRequest) -> HttpResponse:
    teams = teams_submittable(user=request.user)
    gpu_type = default_gpu_type(teams)
    form = NotebookForm(request.POST or None, teams=teams, initial={"gpu_type": gpu_type} if gpu_type else None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        spec = JobSpec(
            name=f"notebook-{request.user.get_username()}",
            team=data["team"],
            tier=data["tier"],
            kind=JobKind.NOTEBOOK,
            gpus_per_replica=data["gpus"],
            gpu_type=data["gpu_type"],
            image=data.get("image") or "",
        )
        try:
            job = job_submit(user=signed_in(request), spec=spec)
            return HttpResponseRedirect(reverse("notebook", args=[job.pk]))
        except ValidationError as error:
            if hasattr(error, "error_dict") and "gpus_per_replica" in error.error_dict:
                error.error_dict["gpus"] = error.error_dict.pop("gpus_per_replica")
            add_service_errors(form, error)
    mine = (
        jobs_visible(user=request.user)
        .filter(user_id=signed_in(request).pk, kind=JobKind.NOTEBOOK)
        .select_related("team")
        .order_by("-submitted_at")[:RECENT]
    )
    status = 400 if request.method == "POST" else 200
    first = teams.first()
    policy = policy_for(team=first, tier=Tier.RESEARCH) if first is not None else None
    context = {"form": form, "notebooks": mine, "timeout_min": math.ceil(policy.timeout_s / 60) if policy else None}
    return render(request, "portal/notebooks.html", context, status=status)


@dataclass(frozen=True)
class Activity:
    """What the idle reaper sees of a running notebook or dev session, for the people who may lose it."""

    kernel_busy: bool | None  # from the agent's probe of the Jupyter server; None: not known yet
    idle_min: int  # the run of GPU-idle minutes ending at the last complete minute
    timeout_min: int
    reap_in_min: int  # if it stays idle
    threshold_pct: float
    stop_at: datetime  # the moment the reaper would stop it if its GPUs stay idle
    warned: bool
    can_extend: bool  # the policy allows one extension and it has not been used
    extend_min: int
    extended_until: datetime | None
    policy_source: str


def idle_activity(job: Job) -> Activity | None:
    if job.state != JobState.RUNNING:
        return None
    now = timezone.now()
    policy = policy_for(team=job.team, tier=job.tier)
    idle_s = idle_seconds(job=job, now=now, threshold_pct=policy.threshold_pct, cap_s=policy.timeout_s)
    busy = Task.objects.filter(job=job, attempt=job.attempt).values_list("notebook_kernel_busy", flat=True).first()
    extended_until = job.idle_extended_at + timedelta(seconds=policy.extend_s) if job.idle_extended_at else None
    # One moment for the words and the countdown: the timeout, an extension and the warning's whole lead.
    stop_at = reap_at(job=job, policy=policy, idle_s=idle_s, now=now)
    return Activity(
        kernel_busy=busy,
        idle_min=int(idle_s // 60),
        timeout_min=math.ceil(policy.timeout_s / 60),
        reap_in_min=max(0, math.ceil((stop_at - now).total_seconds() / 60)),
        threshold_pct=policy.threshold_pct,
        stop_at=stop_at,
        warned=job.idle_warned_at is not None,
        can_extend=policy.allow_extend and job.idle_extended_at is None and job.stop_requested_at is None,
        extend_min=round(policy.extend_s / 60),
        extended_until=extended_until,
        policy_source=policy.source,
    )


def ended_as(job: Job) -> str:
    """How a notebook or dev session ended, in words: a stopped one is not a cancelled batch job."""
    if job.state == JobState.CANCELLED:
        return "Stopped (idle)" if job.stop_reason == "IDLE_TIMEOUT" else "Stopped"
    return job.get_state_display()


@login_required
def notebook_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = _notebook(request, pk)
    is_owner = job.user_id == request.user.pk
    may_open = can_open_notebook(user=request.user, job=job)
    context = {
        "job": job,
        "is_owner": is_owner,
        # Only its owner learns that a server is up: the URL carries the token, and the page says nothing more.
        # Only those who may open it learn that a server is up; the link is the portal's proxy, no token in it.
        "ready": may_open and bool(server_url(job)),
        "can_manage": can_manage_job(user=request.user, job=job),
        "terminal_states": [s.value for s in TERMINAL_STATES],
        "activity": idle_activity(job),
        "state_label": ended_as(job),
    }
    return render_live(request, "portal/notebook_detail.html", context, terminal=job.is_terminal)


@login_required
def notebook_open(request: HttpRequest, pk: int) -> HttpResponse:
    """302 to the notebook through the portal's proxy, for those who may open it (404 for anyone else)."""
    job = _notebook(request, pk)
    if not can_open_notebook(user=request.user, job=job):
        raise Http404("No such notebook")
    if not server_url(job) or job.state != JobState.RUNNING:
        messages.info(request, "The notebook is not running yet")
        return HttpResponseRedirect(reverse("notebook", args=[job.pk]))
    return HttpResponseRedirect(notebook_lab_url(job))


def notebook_lab_elsewhere(request: HttpRequest, pk: int, rest: str = "") -> HttpResponse:
    """/notebooks/<id>/lab/… reached the WSGI web tier: the notebook proxy serves it (portal/notebook_proxy.py).

    Where it lives on another address (YARD_NOTEBOOK_URL; `make run`: port 8001) the browser is sent there;
    otherwise the reverse proxy does not route the path to it, and the page says what to change."""
    target = notebook_public_url()
    if target:
        query = request.META.get("QUERY_STRING", "")
        return HttpResponseRedirect(f"{target}/notebooks/{pk}/lab/{rest}" + (f"?{query}" if query else ""))
    return HttpResponse(
        "Notebooks are served by the portal's notebook proxy (uvicorn portal.asgi:application), and this request "
        "reached the web server instead: route /notebooks/<id>/lab/ (HTTP and websockets) to the notebook proxy "
        "in the reverse proxy, or set YARD_NOTEBOOK_URL to where it listens. See the README, "
        '"Notebooks through the portal".',
        status=502,
        content_type="text/plain",
    )


@login_required
@require_POST
def notebook_stop(request: HttpRequest, pk: int) -> HttpResponse:
    job = access_job_manage(user=request.user, pk=pk)
    if job.kind != JobKind.NOTEBOOK:
        raise Http404("No such notebook")
    if not job.is_terminal:
        job_cancel(job=job, actor=signed_in(request))  # the page says "Stopping" until it has stopped
    return _after_action(request, reverse("notebook", args=[job.pk]))
