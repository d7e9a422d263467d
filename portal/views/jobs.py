"""Jobs: the list, the job page (live by htmx polling), submit with a live admission preview, cancel, run again."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import F, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseClientRedirect

from portal.forms import JobForm, TemplateNameForm, job_initial
from portal.views.common import add_service_errors, partial, signed_in
from portal.views.job_templates import job_template_save, templates_of
from portal.views.svg import sparklines
from scheduling.models import Allocation, Job, TaskLogChunk
from scheduling.selectors import access_job, access_job_manage, can_manage_job, job_tasks, jobs_visible
from scheduling.services import JobSpec, job_cancel, job_preview, job_submit
from scheduling.states import TERMINAL_STATES, JobState, TaskState
from tenants.selectors import is_cluster_admin, teams_submittable, teams_visible, units_administered

PAGE_SIZE = 25
LOG_TAIL_CHUNKS = 40
LOG_TAIL_LINES = 200
POLL_STOP = 286  # htmx stops polling on this status (django_htmx.http.HttpResponseStopPolling)
SORTS = {
    "newest": "-submitted_at",
    "oldest": "submitted_at",
    "name": "name",
    "state": "state",
    "gpus": "-gpus",
}


# --------------------------------------------------------------------------- list


def _can_see_all(user: Any) -> bool:
    return is_cluster_admin(user) or units_administered(user=user).exists()


def _filtered(request: HttpRequest) -> tuple[QuerySet[Job], dict[str, str]]:
    user = request.user
    params = {k: request.GET.get(k, "").strip() for k in ("scope", "state", "team", "gpu_type", "q", "sort")}
    scope = params["scope"] if params["scope"] in ("mine", "team", "all") else "mine"
    if scope == "all" and not _can_see_all(user):
        scope = "team"
    params["scope"] = scope
    jobs = jobs_visible(user=user)
    if scope == "mine":
        jobs = jobs.filter(user_id=signed_in(request).pk)
    elif scope == "team":
        jobs = jobs.filter(team__in=teams_visible(user=user))
    if params["state"] in JobState.values:
        jobs = jobs.filter(state=params["state"])
    if params["team"].isdigit():
        jobs = jobs.filter(team_id=int(params["team"]))
    if params["gpu_type"]:
        jobs = jobs.filter(gpu_type=params["gpu_type"])
    if params["q"]:
        jobs = jobs.filter(name__icontains=params["q"])
    sort = params["sort"] if params["sort"] in SORTS else "newest"
    params["sort"] = sort
    jobs = jobs.annotate(gpus=F("replicas") * F("gpus_per_replica")).select_related("team", "user")
    return jobs.order_by(SORTS[sort], "-id"), params


@login_required
def jobs_list(request: HttpRequest) -> HttpResponse:
    jobs, params = _filtered(request)
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    keep = {k: v for k, v in params.items() if v}
    query = urlencode(keep)
    context = {
        "page": page,
        "params": params,
        "show_user": params["scope"] != "mine",
        "query": query,
        "states": JobState.choices,
        "teams": teams_visible(user=request.user),
        "can_see_all": _can_see_all(request.user),
        "scopes": [("mine", "Mine"), ("team", "My teams")] + ([("all", "All")] if _can_see_all(request.user) else []),
    }
    return render(request, partial(request, "portal/jobs.html", "results"), context)


# --------------------------------------------------------------------------- job page


@dataclass
class Replica:
    rank: int
    node: str
    leaf: str
    task_state: str
    gpus: list[dict[str, Any]] = field(default_factory=list)

    @property
    def nvlink_intact(self) -> bool:
        """Every GPU of the replica in one NVLink domain: its all-reduce never leaves the board."""
        return len({g["nvlink_domain"] for g in self.gpus}) <= 1


def _placement(job: Job) -> list[Replica]:
    tasks = {t.pk: t for t in job_tasks(job=job)}
    replicas = {t.pk: Replica(t.rank, t.node.name, t.node.leaf.name, t.state) for t in tasks.values()}
    allocations = (
        Allocation.objects.filter(job=job, attempt=job.attempt)
        .order_by("task__rank", "gpu__index")
        .values("task_id", "released_at", "gpu_id", "gpu__index", "gpu__nvlink_domain", "gpu__utilization_pct")
    )
    for a in allocations:
        if a["task_id"] in replicas:
            replicas[a["task_id"]].gpus.append(
                {
                    "id": a["gpu_id"],
                    "index": a["gpu__index"],
                    "nvlink_domain": a["gpu__nvlink_domain"],
                    "utilization": a["gpu__utilization_pct"],
                    "live": a["released_at"] is None,
                }
            )
    return sorted(replicas.values(), key=lambda r: r.rank)


def _log_tail(job: Job, rank: int) -> str:
    chunks = list(
        TaskLogChunk.objects.filter(task__job=job, task__attempt=job.attempt, task__rank=rank)
        .order_by("-offset")
        .values_list("data", flat=True)[:LOG_TAIL_CHUNKS]
    )
    text = "".join(reversed(chunks))
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def job_live_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    replicas = _placement(job)
    gpu_ids = [g["id"] for r in replicas for g in r.gpus]
    try:
        rank = max(0, int(request.GET.get("rank", "0")))
    except ValueError:
        rank = 0
    sparks = sparklines(gpu_ids, now=timezone.now())
    for replica in replicas:
        for gpu in replica.gpus:
            gpu["spark"] = sparks.get(gpu["id"])
    return {
        "job": job,
        "terminal": job.is_terminal,
        "events": list(job.events.order_by("time", "id")),
        "replicas": replicas,
        "ranks_running": sum(1 for r in replicas if r.task_state == TaskState.RUNNING),
        "nvlink_intact": all(r.nvlink_intact for r in replicas),
        "log": _log_tail(job, rank),
        "rank": rank,
        "can_manage": can_manage_job(user=request.user, job=job),
    }


def render_live(request: HttpRequest, template: str, context: dict[str, Any], *, terminal: bool) -> HttpResponse:
    """The page, or its live fragment; a fragment of a finished job also tells htmx to stop polling."""
    response = render(request, partial(request, template, "live"), context)
    if request.htmx and terminal:  # type: ignore[attr-defined]
        response.status_code = POLL_STOP
    return response


@login_required
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = access_job(user=request.user, pk=pk)
    return render_live(request, "portal/job_detail.html", job_live_context(request, job), terminal=job.is_terminal)


def _after_action(request: HttpRequest, url: str) -> HttpResponse:
    if request.htmx:  # type: ignore[attr-defined]
        return HttpResponseClientRedirect(url)
    return HttpResponseRedirect(url)


@login_required
@require_POST
def job_cancel_view(request: HttpRequest, pk: int) -> HttpResponse:
    job = access_job_manage(user=request.user, pk=pk)
    if job.is_terminal:
        messages.info(request, f"Job {job.pk} had already ended ({job.get_state_display().lower()})")
    else:
        job_cancel(job=job, actor=signed_in(request))
        messages.success(request, f"Job {job.pk} is being cancelled")
    return _after_action(request, reverse("job", args=[job.pk]))


def spec_of(job: Job, **changes: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "name": job.name,
        "team": job.team,
        "tier": job.tier,
        "kind": job.kind,
        "replicas": job.replicas,
        "gpus_per_replica": job.gpus_per_replica,
        "gpu_type": job.gpu_type,
        "command": job.command,
        "env": dict(job.env or {}),
        "time_limit_s": job.time_limit_s,
        "priority": job.priority,
        "cpus_per_replica": job.cpus_per_replica,
        "memory_mb_per_replica": job.memory_mb_per_replica,
    }
    fields.update(changes)
    return JobSpec(**fields)


@login_required
@require_POST
def job_rerun(request: HttpRequest, pk: int) -> HttpResponse:
    """Requeue a finished job: a new job with the same spec (the old one stays as it ended)."""
    job = access_job(user=request.user, pk=pk)
    try:
        new = job_submit(user=signed_in(request), spec=spec_of(job), copied_from=job)
    except ValidationError as error:
        messages.error(request, "Could not run it again: " + " ".join(error.messages))
        return _after_action(request, reverse("job", args=[job.pk]))
    messages.success(request, f"Submitted job {new.pk}, a copy of job {job.pk}")
    return _after_action(request, reverse("job", args=[new.pk]))


# --------------------------------------------------------------------------- submit


def _initial(request: HttpRequest) -> tuple[dict[str, Any], Job | None]:
    source = request.GET.get("from", "")
    if source:
        job = access_job(user=request.user, pk=source)
        return job_initial(job), job
    template_id = request.GET.get("template", "")
    if template_id:
        template = templates_of(user=request.user).filter(pk=template_id if template_id.isdigit() else 0).first()
        if template is None:
            raise Http404("No such template")
        return dict(template.spec), None
    return {}, None


def _copied_from(request: HttpRequest) -> Job | None:
    source = request.POST.get("copied_from", "")
    return access_job(user=request.user, pk=source) if source else None


def _preview(request: HttpRequest, form: JobForm) -> HttpResponse:
    verdict, errors = None, []
    if form.is_valid():
        try:
            verdict = job_preview(user=signed_in(request), spec=JobSpec(**form.spec_kwargs()))
        except ValidationError as error:
            errors = error.messages
    else:
        errors = [
            f"{form.fields[k].label or k}: {' '.join(map(str, v))}" if k in form.fields else " ".join(map(str, v))
            for k, v in form.errors.items()
        ]
    return render(request, "portal/job_submit.html#preview", {"verdict": verdict, "preview_errors": errors})


@login_required
def job_submit_view(request: HttpRequest) -> HttpResponse:
    teams = teams_submittable(user=request.user)
    if request.method != "POST":
        initial, source = _initial(request)
        form = JobForm(initial=initial, teams=teams)
        return render(request, "portal/job_submit.html", _submit_context(request, form, source))
    form = JobForm(request.POST, teams=teams)
    if request.GET.get("preview"):
        return _preview(request, form)
    source = _copied_from(request)
    if "save_template" in request.POST:
        return _save_template(request, form, source)
    if form.is_valid():
        try:
            job = job_submit(user=signed_in(request), spec=JobSpec(**form.spec_kwargs()), copied_from=source)
            messages.success(request, f"Submitted job {job.pk}")
            return HttpResponseRedirect(reverse("job", args=[job.pk]))
        except ValidationError as error:
            add_service_errors(form, _rename_time_limit(error))
    return render(request, "portal/job_submit.html", _submit_context(request, form, source), status=400)


def _rename_time_limit(error: ValidationError) -> ValidationError:
    """The service names the field time_limit_s; the form asks for hours."""
    if hasattr(error, "error_dict") and "time_limit_s" in error.error_dict:
        error.error_dict["time_limit_h"] = error.error_dict.pop("time_limit_s")
    return error


def _save_template(request: HttpRequest, form: JobForm, source: Job | None) -> HttpResponse:
    name_form = TemplateNameForm(request.POST)
    if form.is_valid() and name_form.is_valid():
        job_template_save(user=signed_in(request), name=name_form.cleaned_data["title"], form=form)
        messages.success(request, f"Saved template {name_form.cleaned_data['title']}")
        return HttpResponseRedirect(reverse("job-submit"))
    return render(request, "portal/job_submit.html", _submit_context(request, form, source, name_form=name_form), status=400)


def _submit_context(request: HttpRequest, form: JobForm, source: Job | None, **extra: Any) -> dict[str, Any]:
    return {
        "form": form,
        "source": source,
        "templates": list(templates_of(user=request.user)),
        "name_form": extra.get("name_form") or TemplateNameForm(),
        "terminal_states": [s.value for s in TERMINAL_STATES],
    }
