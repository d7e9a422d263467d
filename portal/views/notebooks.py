"""Notebooks: launch one, follow it from queued to running, open it (owner only), stop it."""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from portal.forms import NotebookForm
from portal.views.common import add_service_errors, signed_in
from portal.views.jobs import _after_action, render_live
from scheduling.governance.reaper import idle_seconds, policy_for, seconds_to_reap
from scheduling.models import Job, JobKind, Task
from scheduling.selectors import access_job, access_job_manage, can_manage_job, jobs_visible
from scheduling.services import JobSpec, job_cancel, job_submit
from scheduling.states import TERMINAL_STATES, JobState, TaskState
from tenants.selectors import teams_submittable

RECENT = 10


def _notebook(request: HttpRequest, pk: int) -> Job:
    job = access_job(user=request.user, pk=pk)
    if job.kind != JobKind.NOTEBOOK:
        raise Http404("No such notebook")
    return job


def _server_url(job: Job) -> str:
    """The Jupyter server's URL with its token, once the agent's probe of the server got an answer; else "".

    The agent reports the URL as soon as it starts the server, and ``notebook_kernel_busy`` (true or
    false) only while the server answers its probe: offering the link before then would open a refused
    connection.
    """
    task = (
        Task.objects.filter(job=job, attempt=job.attempt, state=TaskState.RUNNING, notebook_kernel_busy__isnull=False)
        .exclude(notebook_url="")
        .only("notebook_url")
        .first()
    )
    return task.notebook_url if task else ""


@login_required
def notebooks(request: HttpRequest) -> HttpResponse:
    teams = teams_submittable(user=request.user)
    form = NotebookForm(request.POST or None, teams=teams)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        spec = JobSpec(
            name=f"notebook-{request.user.get_username()}",
            team=data["team"],
            tier=data["tier"],
            kind=JobKind.NOTEBOOK,
            gpus_per_replica=data["gpus"],
            gpu_type=data["gpu_type"],
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
    return render(request, "portal/notebooks.html", {"form": form, "notebooks": mine}, status=status)


@dataclass(frozen=True)
class Activity:
    """What the idle reaper sees of a running notebook, for the people who may lose it."""

    kernel_busy: bool | None  # from the agent's probe of the Jupyter server; None: not known yet
    idle_min: int  # the run of GPU-idle minutes ending at the last complete minute
    timeout_min: int
    reap_in_min: int  # if it stays idle
    threshold_pct: float


def _activity(job: Job) -> Activity | None:
    if job.state != JobState.RUNNING:
        return None
    now = timezone.now()
    policy = policy_for(team=job.team, tier=job.tier)
    idle_s = idle_seconds(job=job, now=now, threshold_pct=policy.threshold_pct, cap_s=policy.timeout_s)
    busy = Task.objects.filter(job=job, attempt=job.attempt).values_list("notebook_kernel_busy", flat=True).first()
    return Activity(
        kernel_busy=busy,
        idle_min=int(idle_s // 60),
        timeout_min=math.ceil(policy.timeout_s / 60),
        reap_in_min=max(0, math.ceil(seconds_to_reap(job=job, policy=policy, idle_s=idle_s, now=now) / 60)),
        threshold_pct=policy.threshold_pct,
    )


@login_required
def notebook_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = _notebook(request, pk)
    is_owner = job.user_id == request.user.pk
    context = {
        "job": job,
        "is_owner": is_owner,
        # Only its owner learns that a server is up: the URL carries the token, and the page says nothing more.
        "ready": is_owner and bool(_server_url(job)),
        "can_manage": can_manage_job(user=request.user, job=job),
        "terminal_states": [s.value for s in TERMINAL_STATES],
        "activity": _activity(job),
    }
    return render_live(request, "portal/notebook_detail.html", context, terminal=job.is_terminal)


@login_required
def notebook_open(request: HttpRequest, pk: int) -> HttpResponse:
    """302 to the Jupyter server with its token, for the notebook's owner only (404 for anyone else)."""
    job = _notebook(request, pk)
    if job.user_id != request.user.pk:
        raise Http404("No such notebook")
    url = _server_url(job)
    if not url or job.is_terminal:
        messages.info(request, "The notebook is not running yet")
        return HttpResponseRedirect(reverse("notebook", args=[job.pk]))
    return HttpResponseRedirect(url)


@login_required
@require_POST
def notebook_stop(request: HttpRequest, pk: int) -> HttpResponse:
    job = access_job_manage(user=request.user, pk=pk)
    if job.kind != JobKind.NOTEBOOK:
        raise Http404("No such notebook")
    if not job.is_terminal:
        job_cancel(job=job, actor=signed_in(request))
        messages.success(request, "Stopping the notebook")
    return _after_action(request, reverse("notebook", args=[job.pk]))
