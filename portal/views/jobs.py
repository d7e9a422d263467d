"""Jobs: the list, the job page (live by htmx polling), submit with a live admission preview, cancel, run again."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db.models import F, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, StreamingHttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from django_htmx.http import HttpResponseClientRedirect

from portal.forms import JobForm, TemplateNameForm, gpu_type_choices, job_initial
from portal.views.common import add_service_errors, partial, signed_in
from portal.views.job_templates import job_template_save, templates_of
from portal.views.svg import sparklines
from scheduling.core.reasons import memory_words
from scheduling.models import Allocation, Job, JobArray, TaskLogChunk, Tier
from scheduling.selectors import (
    access_array,
    access_job,
    access_job_manage,
    array_state_counts,
    can_manage_job,
    job_tasks,
    jobs_visible,
)
from scheduling.services import JobSpec, array_spec_parse, job_array_submit, job_cancel, job_preview, job_spec_of, job_submit
from scheduling.states import TERMINAL_STATES, JobState, TaskState
from tenants.models import OrgUnit, Quota
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
    params = {k: request.GET.get(k, "").strip() for k in ("scope", "state", "team", "gpu_type", "q", "sort", "array")}
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
    if params["array"].isdigit():
        jobs = jobs.filter(array_id=int(params["array"]))  # an array's tasks, a row each
    else:
        params["array"] = ""
        # An array is one row, its first task's, wherever any of its tasks matches the filters.
        jobs = Job.objects.filter(
            Q(pk__in=jobs.filter(array__isnull=True).values("pk")) | Q(pk__in=jobs.filter(array__isnull=False).values("array_id"))
        )
    sort = params["sort"] if params["sort"] in SORTS else "newest"
    params["sort"] = sort
    jobs = jobs.annotate(gpus=F("replicas") * F("gpus_per_replica")).select_related("team", "user")
    return jobs.order_by(SORTS[sort], "-id"), params


@login_required
def jobs_list(request: HttpRequest) -> HttpResponse:
    jobs, params = _filtered(request)
    page = Paginator(jobs, PAGE_SIZE).get_page(request.GET.get("page"))
    if not params["array"]:
        heads = [job for job in page.object_list if job.array_id is not None and job.array_id == job.pk]
        arrays = JobArray.objects.in_bulk([job.pk for job in heads])
        counts = array_state_counts(list(arrays))
        for job in heads:
            job.array_summary = _array_summary(arrays[job.pk], counts.get(job.pk, {}))
    keep = {k: v for k, v in params.items() if v}
    query = urlencode(keep)
    context = {
        "page": page,
        "params": params,
        "show_user": params["scope"] != "mine",
        "query": query,
        "states": JobState.choices,
        "array": JobArray.objects.filter(pk=int(params["array"])).first() if params["array"] else None,
        "teams": teams_visible(user=request.user),
        "can_see_all": _can_see_all(request.user),
        "scopes": [("mine", "Mine"), ("team", "My teams")] + ([("all", "All")] if _can_see_all(request.user) else []),
    }
    return render(request, partial(request, "portal/jobs.html", "results"), context)


@dataclass
class ArraySummary:
    """A job array's row in the list: its indices, its tasks per state and, opened, its first tasks."""

    array: JobArray
    counts: list[tuple[str, str, int]]  # (label, state, tasks), busiest states first
    tasks: list[Job] = field(default_factory=list)
    open: bool = False

    @property
    def more(self) -> int:
        return self.array.task_count - len(self.tasks) if self.open else 0


ARRAY_TASKS_SHOWN = 50
_STATE_ORDER = [JobState.RUNNING, JobState.STARTING, JobState.PREEMPTING, JobState.PENDING, JobState.COMPLETED,
                JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.LOST]  # fmt: skip


def _array_summary(array: JobArray, counts: dict[str, int]) -> ArraySummary:
    ordered = [(state.label, state.value, counts[state]) for state in _STATE_ORDER if counts.get(state)]
    return ArraySummary(array=array, counts=ordered)


@login_required
@require_GET
def job_array_rows(request: HttpRequest, pk: int) -> HttpResponse:
    """An array's rows of the job list (htmx): the array alone, or opened (?open=1) with its first tasks."""
    array = access_array(user=request.user, pk=pk)
    head = access_job(user=request.user, pk=pk)
    summary = _array_summary(array, array_state_counts([array.pk]).get(array.pk, {}))
    if request.GET.get("open") == "1":
        summary.open = True
        summary.tasks = list(
            Job.objects.filter(array=array).select_related("team", "user").order_by("array_index")[:ARRAY_TASKS_SHOWN]
        )
    context = {"job": head, "summary": summary, "show_user": request.GET.get("user") == "1"}
    return render(request, "portal/_array_rows.html", context)


# --------------------------------------------------------------------------- job page


@dataclass
class Replica:
    rank: int
    node: str
    leaf: str
    task_state: str
    gpus: list[dict[str, Any]] = field(default_factory=list)
    # Given (the job's cores and MiB per replica) and really used, as the agent last reported (None: not yet).
    cpus: int = 0
    memory_mb: int = 0
    cpu_used: float | None = None
    memory_used_mb: float | None = None
    memory_peak_mb: float | None = None

    @property
    def nvlink_intact(self) -> bool:
        """Every GPU of the replica in one NVLink domain: its all-reduce never leaves the board."""
        return len({g["nvlink_domain"] for g in self.gpus}) <= 1


@dataclass
class NodeGroup:
    """The ranks of a job on one node: one summary line, its GPUs on demand (a 24 x 8 gang is 24 lines, not 192)."""

    node: str
    leaf: str
    replicas: list[Replica]
    open: bool = False

    @property
    def ranks(self) -> str:
        """'rank 3', 'ranks 0-2', 'ranks 0, 4, 8'."""
        numbers = sorted(r.rank for r in self.replicas)
        if len(numbers) == 1:
            return f"rank {numbers[0]}"
        if numbers == list(range(numbers[0], numbers[-1] + 1)):
            return f"ranks {numbers[0]}–{numbers[-1]}"
        return "ranks " + ", ".join(map(str, numbers))

    @property
    def gpus(self) -> list[dict[str, Any]]:
        return [g for r in self.replicas for g in r.gpus]

    @property
    def states(self) -> str:
        """'running', or '2 running, 1 assigned' when the node's ranks differ."""
        counts = Counter(TaskState(r.task_state).label.lower() for r in self.replicas)
        if len(counts) == 1:
            return next(iter(counts))
        return ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))

    @property
    def all_running(self) -> bool:
        return all(r.task_state == TaskState.RUNNING for r in self.replicas)

    @property
    def mean_utilization(self) -> float | None:
        values = [g["utilization"] for g in self.gpus if g["utilization"] is not None]
        return sum(values) / len(values) if values else None

    @property
    def nvlink_intact(self) -> bool:
        return all(r.nvlink_intact for r in self.replicas)

    def _used(self, name: str) -> float | None:
        values = [getattr(r, name) for r in self.replicas if getattr(r, name) is not None]
        return sum(values) if values else None

    @property
    def cpu_text(self) -> str:
        """'3.2 of 4 cores' (the node's ranks together), '—' before the agent reported any."""
        used = self._used("cpu_used")
        given = sum(r.cpus for r in self.replicas)
        return "—" if used is None else f"{used:.1f} of {given} core{'s' if given != 1 else ''}"

    @property
    def memory_text(self) -> str:
        """'12.1 of 16 GiB, peak 14.0', '—' before the agent reported any."""
        used, peak = self._used("memory_used_mb"), self._used("memory_peak_mb")
        if used is None:
            return "—"
        given = sum(r.memory_mb for r in self.replicas)
        if used < 1024:  # a small process: "180 MiB of 512 GiB", not "0.2 of 512 GiB"
            text = f"{used:.0f} MiB of {memory_words(given)}"
            return text if peak is None else f"{text}, peak {memory_words(round(peak))}"
        text = f"{used / 1024:.1f} of {f'{given / 1024:.1f}'.removesuffix('.0')} GiB"
        return text if peak is None else f"{text}, peak {peak / 1024:.1f}"


# A gang this small shows every GPU with its chart at once; a larger one opens the nodes asked for.
OPEN_ALL_GPUS = 16


def _placement(job: Job) -> list[Replica]:
    tasks = {t.pk: t for t in job_tasks(job=job)}
    replicas = {
        t.pk: Replica(
            t.rank,
            t.node.name,
            t.node.leaf.name,
            t.state,
            cpus=job.cpus_per_replica,
            memory_mb=job.memory_mb_per_replica,
            cpu_used=t.cpu_used,
            memory_used_mb=t.memory_used_mb,
            memory_peak_mb=t.memory_peak_mb,
        )
        for t in tasks.values()
    }
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


def _node_groups(replicas: list[Replica], *, opened: set[str]) -> list[NodeGroup]:
    groups: dict[str, NodeGroup] = {}
    for replica in replicas:  # rank order: the groups come in the order of their first rank
        group = groups.get(replica.node)
        if group is None:
            group = groups[replica.node] = NodeGroup(replica.node, replica.leaf, [])
        group.replicas.append(replica)
    small = sum(len(r.gpus) for r in replicas) <= OPEN_ALL_GPUS
    for group in groups.values():
        group.open = small or group.node in opened
    return list(groups.values())


def _log_tail(job: Job, rank: int) -> str:
    chunks = list(
        TaskLogChunk.objects.filter(task__job=job, task__attempt=job.attempt, task__rank=rank)
        .order_by("-offset")
        .values_list("data", flat=True)[:LOG_TAIL_CHUNKS]
    )
    text = "".join(reversed(chunks))
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


def _rank_of(request: HttpRequest) -> int:
    try:
        return max(0, int(request.GET.get("rank", "0")))
    except ValueError:
        return 0


def _waiting(job: Job) -> dict[str, Any] | None:
    """What the page says of a pending job: about to start (the admission check or the cycle said it
    fits), or waiting, and why, with the estimated start where there is one."""
    if job.state != JobState.PENDING:
        return None
    reason = job.pending_reason
    starting = not reason or reason.startswith(("queued", "fits now", "requeued"))
    return {"starting": starting, "reason": reason, "estimated_start": job.estimated_start}


def job_live_context(request: HttpRequest, job: Job) -> dict[str, Any]:
    replicas = _placement(job)
    opened = {name for name in request.GET.get("open", "").split(",") if name}
    groups = _node_groups(replicas, opened=opened)
    sparks = sparklines([g["id"] for group in groups if group.open for g in group.gpus], now=timezone.now())
    for group in groups:
        for gpu in group.gpus:
            gpu["spark"] = sparks.get(gpu["id"]) if group.open else None
    rank = _rank_of(request)
    return {
        "job": job,
        "terminal": job.is_terminal,
        "events": list(job.events.order_by("time", "id")),
        "replicas": replicas,
        "node_groups": groups,
        "ranks_running": sum(1 for r in replicas if r.task_state == TaskState.RUNNING),
        "nvlink_intact": all(r.nvlink_intact for r in replicas),
        "log": _log_tail(job, rank),
        "log_lines": LOG_TAIL_LINES,
        "rank": rank,
        "rank_choices": [r.rank for r in replicas] or list(range(job.replicas)),
        "waiting": _waiting(job),
        "can_manage": can_manage_job(user=request.user, job=job),
        "clock": _clock(job),
    }


def _clock(job: Job) -> dict[str, Any]:
    """A running job's time left before its time limit stops it, and whether it may be preempted (then
    the page says when it last checkpointed)."""
    started = job.started_at if job.state == JobState.RUNNING else None
    ends_at = started + timedelta(seconds=job.time_limit_s) if started is not None else None
    remaining = max(0.0, (ends_at - timezone.now()).total_seconds()) if ends_at else None
    preemptible = job.tier != Tier.PRODUCTION and job.state in (JobState.RUNNING, JobState.PREEMPTING)
    return {"ends_at": ends_at, "remaining_s": remaining, "preemptible": preemptible}


@login_required
@require_GET
def job_log_download(request: HttpRequest, pk: int) -> StreamingHttpResponse:
    """The whole log of one rank of the job's current attempt (or ``?attempt=``), as a text file."""
    job = access_job(user=request.user, pk=pk)
    rank = _rank_of(request)
    attempt_text = request.GET.get("attempt", "")
    attempt = int(attempt_text) if attempt_text.isdigit() else job.attempt
    chunks = (
        TaskLogChunk.objects.filter(task__job=job, task__attempt=attempt, task__rank=rank)
        .order_by("offset")
        .values_list("data", flat=True)
    )
    response = StreamingHttpResponse(chunks.iterator(chunk_size=200), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-attempt-{attempt}-rank-{rank}.log"'
    return response


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
        # No flash message: the page itself says "Stopping (cancelled)" until the job has ended, then
        # its state; a banner saying "being cancelled" would linger on a job long cancelled.
        job_cancel(job=job, actor=signed_in(request))
    return _after_action(request, reverse("job", args=[job.pk]))


def spec_of(job: Job, **changes: Any) -> JobSpec:
    return job_spec_of(job, **changes)


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


def default_gpu_type(teams: QuerySet[OrgUnit], team_id: Any = None) -> str | None:
    """The GPU type a new job of this team most likely wants: the one its quota guarantees most (then
    allows most), among the types the form offers; None when its quota names none of them."""
    offered = {value for value, _ in gpu_type_choices()}
    team = teams.filter(pk=team_id).first() if str(team_id or "").isdigit() else teams.first()
    if team is None:
        return None
    quotas = Quota.objects.filter(unit=team, gpu_type__in=offered).exclude(guaranteed=0, limit=0)
    best = max(quotas, key=lambda q: (q.guaranteed, q.limit if q.limit is not None else 10**9, q.gpu_type), default=None)
    return best.gpu_type if best else None


def _preview(request: HttpRequest, form: JobForm) -> HttpResponse:
    verdict, errors = None, []
    if not (form.data.get("name") or "").strip():
        # The check needs no name: before one is typed, preview with a stand-in rather than answer
        # "name: This field is required." to someone who has not typed anything yet.
        data = request.POST.copy()
        data["name"] = "(unnamed)"
        form = JobForm(data, teams=form.fields["team"].queryset)  # type: ignore[attr-defined]
    tasks = 0
    if form.is_valid():
        try:
            verdict = job_preview(user=signed_in(request), spec=JobSpec(**form.spec_kwargs()))
            tasks = array_spec_parse(form.cleaned_data["array"]).count if form.cleaned_data["array"] else 0
        except ValidationError as error:
            errors = error.messages
    else:
        errors = [
            f"{form.fields[k].label or k}: {' '.join(map(str, v))}" if k in form.fields else " ".join(map(str, v))
            for k, v in form.errors.items()
        ]
    context = {"verdict": verdict, "preview_errors": errors, "array_tasks": tasks}
    return render(request, "portal/job_submit.html#preview", context)


@login_required
def job_submit_view(request: HttpRequest) -> HttpResponse:
    teams = teams_submittable(user=request.user)
    if request.method != "POST":
        initial, source = _initial(request)
        if "gpu_type" not in initial and (gpu_type := default_gpu_type(teams, initial.get("team"))):
            initial["gpu_type"] = gpu_type
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
            if form.cleaned_data["array"]:
                made = job_array_submit(
                    user=signed_in(request),
                    spec=JobSpec(**form.spec_kwargs()),
                    array=form.cleaned_data["array"],
                    copied_from=source,
                )
                messages.success(request, f"Submitted array {made.array.pk}: {made.array.task_count} jobs ({made.array.text})")
                return HttpResponseRedirect(f"{reverse('jobs')}?array={made.array.pk}")
            job = job_submit(user=signed_in(request), spec=JobSpec(**form.spec_kwargs()), copied_from=source)
            messages.success(request, f"Submitted job {job.pk}")
            return HttpResponseRedirect(reverse("job", args=[job.pk]))
        except ValidationError as error:
            add_service_errors(form, _rename_time_limit(error))
    return render(request, "portal/job_submit.html", _submit_context(request, form, source), status=400)


def _rename_time_limit(error: ValidationError) -> ValidationError:
    """The service names the fields time_limit_s and memory_mb_per_replica; the form asks hours and GiB."""
    if hasattr(error, "error_dict"):
        for service_name, form_name in (("time_limit_s", "time_limit_h"), ("memory_mb_per_replica", "memory_gb_per_replica")):
            if service_name in error.error_dict:
                error.error_dict[form_name] = error.error_dict.pop(service_name)
    return error


def _save_template(request: HttpRequest, form: JobForm, source: Job | None) -> HttpResponse:
    name_form = TemplateNameForm(request.POST)
    if form.is_valid() and name_form.is_valid():
        template = job_template_save(user=signed_in(request), name=name_form.cleaned_data["title"], form=form)
        messages.success(request, f"Saved template {name_form.cleaned_data['title']}")
        # Back to the same form, filled from the template just saved: saving is not submitting, and an
        # empty form after it read as if the work was lost.
        return HttpResponseRedirect(f"{reverse('job-submit')}?template={template.pk}")
    return render(request, "portal/job_submit.html", _submit_context(request, form, source, name_form=name_form), status=400)


def _submit_context(request: HttpRequest, form: JobForm, source: Job | None, **extra: Any) -> dict[str, Any]:
    return {
        "form": form,
        "source": source,
        "templates": list(templates_of(user=request.user)),
        "name_form": extra.get("name_form") or TemplateNameForm(),
        "terminal_states": [s.value for s in TERMINAL_STATES],
    }
