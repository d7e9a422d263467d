"""REST API v1, jobs: list, submit (JSON or a job file), preview, detail, cancel, rerun, logs.

One view per operation; access_* selectors do the tenant check (the same 404 for another tenant's
object as for a missing one), one service writes and the services write the audit entries. The
notebook views (notebooks.py) are these with kind=notebook; what a submission's body becomes is
submission.py's.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import Prefetch, QuerySet
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, PolymorphicProxySerializer, extend_schema
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api import serializers as s
from scheduling.api.base import ERROR, ERRORS, ID_PARAM, IDEMPOTENCY, ApiView, BoundedJSONParser, JobCursor, _team_from_ref
from scheduling.api.schema import query_text
from scheduling.api.submission import (
    JOB_FILE_PARSERS,
    _never_runnable,
    _spec_from,
    _submission,
    _submit,
    _submit_array_once,
    _submit_once,
)
from scheduling.core.types import Verdict
from scheduling.models import Allocation, Job, JobArray, JobEvent, JobKind, Task
from scheduling.selectors import (
    access_job,
    access_job_manage,
    array_state_counts,
    jobs_visible,
    task_log_read,
    task_log_tail,
)
from scheduling.services import MAX_REPLICAS, NEVER_RUNS, JobSpec, job_cancel, job_preview, job_spec_of
from scheduling.states import JobState
from tenants.selectors import units_visible


def _detail_queryset() -> QuerySet[Job]:
    tasks = Task.objects.select_related("node__leaf").prefetch_related(
        Prefetch("allocations", queryset=Allocation.objects.select_related("gpu"))
    )
    return Job.objects.select_related("team", "user").prefetch_related(Prefetch("tasks", queryset=tasks), "events")


def _as_submitted(job: Job) -> Job:
    """A job just made by job_submit, with what the detail serializer reads (no task yet, its one event)
    in place, so showing it costs no query (a submission at CI rates must not read back what it wrote)."""
    event = job.submit_event  # type: ignore[attr-defined]
    tasks, events = _prefetched(Task.objects.all(), []), _prefetched(JobEvent.objects.all(), [event])
    job._prefetched_objects_cache = {"tasks": tasks, "events": events}  # type: ignore[attr-defined]
    return job


def _prefetched(qs: QuerySet[Any], rows: list[Any]) -> QuerySet[Any]:
    """A queryset that is already evaluated to ``rows``, as prefetch_related leaves one. (An empty
    ``none()`` is no such thing: iterating it compiles the query to find it empty, 0.15 ms a submission.)"""
    qs._result_cache = rows
    qs._prefetch_done = True  # type: ignore[attr-defined]
    return qs


def _detail(request: Request, job: Job) -> dict[str, Any]:
    job = _detail_queryset().get(pk=job.pk)
    return cast(dict[str, Any], s.JobDetailOut(job, context={"viewer": request.user, "request": request}).data)


class _JobCollection(ApiView):
    kind: str = JobKind.BATCH
    input_serializer: type[Any] = s.JobSubmitIn
    pagination_class = JobCursor  # also tells the schema generator that lists come in pages

    def _list(self, request: Request) -> Response:
        filters = s.JobListFilterIn(data=request.query_params)
        filters.is_valid(raise_exception=True)
        jobs = jobs_visible(user=request.user).filter(kind=self.kind).select_related("team", "user")
        f = filters.validated_data
        if f.get("state"):
            jobs = jobs.filter(state__in=sorted(f["state"]))
        if "team" in f:
            team = _team_from_ref(f["team"], user=request.user, candidates=units_visible(user=request.user))
            if team is None:
                # the same answer for another tenant's team as for a missing one
                raise ValidationError({"team": ["No such team, or not one you can see"]})
            jobs = jobs.filter(team=team)
        if "user" in f:
            jobs = jobs.filter(user__username=f["user"])
        if "tier" in f:
            jobs = jobs.filter(tier=f["tier"])
        if "since" in f:
            jobs = jobs.filter(submitted_at__gte=f["since"])
        if "array" in f:
            jobs = jobs.filter(array_id=f["array"])
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(jobs, request, view=self)
        return paginator.get_paginated_response(s.JobOut(page, many=True).data)

    def _create(self, request: Request) -> Response:
        body = self.input_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = cast(User, request.user)  # IsAuthenticated let it through
        key = request.headers.get("Idempotency-Key") or None
        spec = _spec_from(body.validated_data, user=request.user, kind=self.kind)
        job, created = _submit_once(user, spec, key=key)
        return Response(_detail(request, job), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


_STATES = "|".join(JobState.values)
_LIST_PARAMS = [
    OpenApiParameter(
        "state",
        {"type": "string", "pattern": f"^({_STATES})(,({_STATES}))*$"},
        description="One or more states, comma-separated",
    ),
    OpenApiParameter("team", query_text("Team id or slug")),
    OpenApiParameter("user", query_text("Username", max_length=150)),
    OpenApiParameter("tier", OpenApiTypes.INT, enum=[1, 2, 3]),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="Submitted at or after"),
    OpenApiParameter("array", {"type": "integer", "minimum": 1, "maximum": 2**62}, description="The tasks of this job array"),
    OpenApiParameter("cursor", query_text("From the previous page's next/previous link", max_length=1000)),
    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 200}, description="At most 200"),
]

_FILE_PARAMS = [
    OpenApiParameter("team", query_text("Job files only: the team (id or slug) where the file names none")),
    OpenApiParameter("name", query_text("Job files only: the job's name where the file gives none", max_length=200)),
]
_SUBMIT_REQUEST = {
    "application/json": PolymorphicProxySerializer(
        component_name="JobSubmitRequest",
        serializers=[s.JobSubmitIn, s.JobFileIn],
        resource_type_field_name=None,
    ),
    "application/yaml": OpenApiTypes.STR,
    "text/x-shellscript": OpenApiTypes.STR,
}


_SUBMITTED = PolymorphicProxySerializer(
    component_name="JobSubmitResponse",
    serializers=[s.JobSubmitOut, s.JobArraySubmitOut],
    resource_type_field_name=None,
)


def array_out(array: JobArray) -> dict[str, Any]:
    """The array as JobArrayOut shows it: its first task's name, team and owner (all its tasks share them)."""
    head = Job.objects.select_related("team", "user").get(pk=array.pk)
    return {
        "id": array.pk,
        "name": head.name,
        "team": head.team,
        "user": head.user.get_username(),
        "array": array.text,
        "task_count": array.task_count,
        "max_running": array.max_running,
        "states": array_state_counts([array.pk]).get(array.pk, {}),
        "submitted_at": array.submitted_at,
        "tasks": f"/api/v1/jobs?array={array.pk}",
    }


class JobListCreateView(_JobCollection):
    parser_classes = [BoundedJSONParser, *JOB_FILE_PARSERS]

    @extend_schema(operation_id="jobs_list", parameters=_LIST_PARAMS, responses={200: s.JobOut(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        return self._list(request)

    @extend_schema(
        operation_id="jobs_create",
        description="Submit a job: the API's JSON fields; or a job file as it is, translated here (docs/job-files.md): "
        "a Yardmaster job file or a kubeflow.org/v1 PyTorchJob/MPIJob manifest as application/yaml, a Slurm "
        'batch script as text/x-shellscript, or either as JSON {"format": ..., "file": ...}. A field of a file '
        "that cannot be honoured is a 400 naming it; what is ignored without changing the result is in warnings. "
        "With array (sbatch's --array, 0-999%50; or a script's #SBATCH --array), one job per index, checked once: "
        "the answer is the array (its id, its task count), not a job.",
        request=_SUBMIT_REQUEST,
        parameters=[IDEMPOTENCY, *_FILE_PARAMS],
        responses={201: _SUBMITTED, 200: _SUBMITTED, 409: ERROR, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        fields, translation = _submission(request)
        user = cast(User, request.user)  # IsAuthenticated let it through
        key = request.headers.get("Idempotency-Key") or None
        array = fields.pop("array", "")
        spec = _spec_from(fields, user=request.user, kind=JobKind.BATCH)
        if array:
            made = _submit_array_once(user, spec, array=array, key=key)
            out = array_out(made.array) | {
                "verdict": made.verdict,
                "translated_from": translation.source if translation else None,
                "warnings": translation.warnings if translation else [],
            }
            return Response(s.JobArraySubmitOut(out).data, status=status.HTTP_201_CREATED if made.created else status.HTTP_200_OK)
        job, created = _submit_once(user, spec, key=key)
        context = {
            "viewer": request.user,
            "request": request,
            "translated_from": translation.source if translation else None,
            "warnings": translation.warnings if translation else [],
        }
        # A job made by this request is shown as job_submit returned it (no task yet, its one event); a
        # replay is read back whole, as it may have run since.
        shown = _as_submitted(job) if created else _detail_queryset().get(pk=job.pk)
        out = s.JobSubmitOut(shown, context=context).data
        return Response(out, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class JobPreviewView(ApiView):
    parser_classes = JobListCreateView.parser_classes

    @extend_schema(
        operation_id="jobs_preview",
        description="The admission check without submitting (as sbatch --test-only, and the portal's submit page): "
        "the same bodies as POST /api/v1/jobs. Says whether the job fits now and where, how long it would wait "
        "and why, or why it can never run; and, for a job file, the job it translates to and the warnings. "
        "Submitting does only the fast accept-or-refuse check: this is the full one, with a scheduling plan.",
        request=_SUBMIT_REQUEST,
        parameters=_FILE_PARAMS,
        responses={200: s.JobPreviewOut, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        fields, translation = _submission(request)
        spec = _spec_from(fields, user=request.user, kind=JobKind.BATCH)
        try:
            verdict = job_preview(user=cast(User, request.user), spec=spec)
        except ValidationError as exc:
            # A GPU type the cluster lacks is a field error of the spec, and the preview's answer is its verdict.
            never = _never_runnable(exc)
            if never is None:
                raise
            verdict = Verdict(ok=False, reason=str(never.detail).removeprefix(f"{NEVER_RUNS}: "))
        job = {k: v for k, v in fields.items() if k != "team"} | {"team": spec.team.slug}
        out = {
            "ok": verdict.ok,
            "fits_now": verdict.ok and verdict.reason.startswith("fits now"),
            "verdict": verdict.reason,
            "job": job,
            "translated_from": translation.source if translation else None,
            "warnings": translation.warnings if translation else [],
        }
        return Response(s.JobPreviewOut(out).data)


class _JobItem(ApiView):
    kind: str = JobKind.BATCH

    def _job(self, request: Request, pk: int, *, manage: bool = False) -> Job:
        job = (access_job_manage if manage else access_job)(user=request.user, pk=pk)
        if job.kind != self.kind:
            raise Http404("No such job")
        return job


class JobDetailView(_JobItem):
    @extend_schema(operation_id="jobs_retrieve", parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return Response(_detail(request, self._job(request, pk)))


class JobCancelView(_JobItem):
    @extend_schema(operation_id="jobs_cancel", request=None, parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def post(self, request: Request, pk: int) -> Response:
        job = job_cancel(job=self._job(request, pk, manage=True), actor=cast(User, request.user))
        return Response(_detail(request, job))


def _spec_of(job: Job) -> JobSpec:
    """The job's own spec, to submit again (as the portal's "Run again" does)."""
    return job_spec_of(job)


class JobRerunView(_JobItem):
    @extend_schema(
        operation_id="jobs_rerun",
        description="Submit a new job with this job's spec (the old one stays as it ended), as yours, if you may "
        "submit to its team. The new job's copied_from is this one.",
        request=None,
        parameters=[ID_PARAM],
        responses={201: s.JobDetailOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        job = self._job(request, pk)
        new = _submit(cast(User, request.user), _spec_of(job), copied_from=job)
        return Response(_detail(request, new), status=status.HTTP_201_CREATED)


_LOG_PARAMS = [
    ID_PARAM,
    OpenApiParameter("rank", {"type": "integer", "minimum": 0, "maximum": MAX_REPLICAS}, description="Rank (default 0)"),
    OpenApiParameter(
        "attempt", {"type": "integer", "minimum": 1, "maximum": 1_000_000}, description="Attempt (default the current one)"
    ),
    OpenApiParameter(
        "offset", {"type": "integer", "minimum": 0, "maximum": 2**62}, description="Text from this byte; follow with next_offset"
    ),
    OpenApiParameter(
        "tail", {"type": "integer", "minimum": 0, "maximum": 10_000}, description="The last N lines (at most 10000)"
    ),
]


class JobLogsView(_JobItem):
    @extend_schema(operation_id="jobs_logs", parameters=_LOG_PARAMS, responses={200: s.JobLogsOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        job = self._job(request, pk)
        params = s.JobLogsIn(data=request.query_params)
        params.is_valid(raise_exception=True)
        p = params.validated_data
        attempt = p.get("attempt", job.attempt)
        task = Task.objects.filter(job=job, attempt=attempt, rank=p["rank"]).first()
        offset, text, next_offset = p.get("offset", 0), "", p.get("offset", 0)
        if task is not None:
            if "tail" in p:
                text, next_offset = task_log_tail(task=task, lines=p["tail"])
                offset = next_offset - len(text.encode("utf-8"))
            else:
                text, next_offset = task_log_read(task=task, offset=offset)
        out = {
            "job": job.pk,
            "rank": p["rank"],
            "attempt": attempt,
            "task_state": task.state if task else None,
            "offset": max(offset, 0),
            "next_offset": next_offset,
            "text": text,
        }
        return Response(s.JobLogsOut(out).data)
