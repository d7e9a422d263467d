"""REST API v1 for people and CI: one view per operation; access_* selectors do the tenant check.

Views parse input, load objects through selectors (the same 404 for another tenant's object
as for a missing one), call one service and render. Services write the audit entries.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Prefetch, Q, QuerySet
from django.http import Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, PolymorphicProxySerializer, extend_schema
from rest_framework import exceptions, status
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling import jobfiles
from scheduling.api import serializers as s
from scheduling.api.errors import api_exception_handler
from scheduling.api.permissions import TokenRateThrottle, add_rate_limit_headers
from scheduling.api.schema import (
    ApiTokenScheme,  # noqa: F401  (registers the auth scheme)
    query_text,
)
from scheduling.core.types import Verdict
from scheduling.models import Allocation, Job, JobEvent, JobKind, Node, Task
from scheduling.selectors import (
    access_job,
    access_job_manage,
    fairshare_standing,
    jobs_visible,
    task_log_read,
    task_log_tail,
    team_quota_usage,
    yard_number,
)
from scheduling.services import MAX_REPLICAS, NEVER_RUNS, JobSpec, job_cancel, job_preview, job_spec_of, job_submit
from scheduling.states import JobState
from tenants.models import ApiToken, OrgUnit, Quota, TokenKind, UnitKind
from tenants.selectors import access_unit, is_cluster_admin, teams_submittable, units_visible, user_roles

ERROR = OpenApiResponse(description='{"code": "...", "message": "...", "fields": {"field": ["..."]}}')
ERRORS = {400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 429: ERROR}
ID_PARAM = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)
IDEMPOTENCY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 128},
    OpenApiParameter.HEADER,
    description="A CI retry with the same key and body gets the same job (200), never a second one; "
    "the same key with another body is a 409.",
)


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser, with JSON nested deeper than the decoder recurses a 400 like any other bad JSON
    (DRF catches ValueError only: a body of 200 000 "[" was a RecursionError and a 500)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise exceptions.ParseError("JSON parse error - nested too deeply") from None


class ApiView(APIView):
    """The API's error shape and the per-token throttle, with its RateLimit-* headers, for every view."""

    throttle_classes = [TokenRateThrottle]
    # JSON (and job files where a view says so): what the schema documents and clients send; form posts
    # are the portal pages' business, not the API's.
    parser_classes: list[type[BaseParser]] = [BoundedJSONParser]

    def get_exception_handler(self) -> Any:
        return api_exception_handler

    def get_throttles(self) -> list[Any]:
        # Kept for finalize_response: the throttle that counted this request knows what is left of the window.
        self._throttles: list[Any] = super().get_throttles()
        return self._throttles

    def finalize_response(self, request: Request, response: Any, *args: Any, **kwargs: Any) -> Any:
        response = super().finalize_response(request, response, *args, **kwargs)
        add_rate_limit_headers(response, getattr(self, "_throttles", []))
        return response


class JobCursor(CursorPagination):
    ordering = "-id"  # ids grow with submission: a stable cursor even when many share a timestamp
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def get_page_size(self, request: Any) -> int:
        # DRF quietly serves 50 for ?page_size=0 and 200 for ?page_size=5000; say what to change instead.
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        if not raw.isdigit() or not 1 <= int(raw) <= self.max_page_size:
            raise ValidationError({"page_size": [f"A whole number from 1 to {self.max_page_size}"]})
        return int(raw)


def _team_from_ref(ref: str, *, user: Any, candidates: QuerySet[OrgUnit]) -> OrgUnit | None:
    lookup = Q(slug=ref) | Q(pk=int(ref)) if ref.isdigit() and len(ref) < 19 else Q(slug=ref)
    return candidates.filter(lookup).first()


def _spec_from(data: dict[str, Any], *, user: Any, kind: str) -> JobSpec:
    team = _team_from_ref(data["team"], user=user, candidates=teams_submittable(user=user))
    if team is None:
        # the same answer for a team that exists elsewhere as for none: no probing of the org tree
        raise ValidationError({"team": ["No such team, or not one you may submit to"]})
    if kind == JobKind.NOTEBOOK:
        return JobSpec(
            name=data["name"],
            team=team,
            tier=data["tier"],
            kind=JobKind.NOTEBOOK,
            replicas=1,
            gpus_per_replica=data["gpus"],
            gpu_type=data["gpu_type"],
            time_limit_s=data.get("time_limit_s"),
            image=data.get("image", ""),  # refused by job_submit: a notebook cannot run in an image yet
        )
    return JobSpec(
        name=data["name"],
        team=team,
        tier=data["tier"],
        replicas=data["replicas"],
        gpus_per_replica=data["gpus_per_replica"],
        gpu_type=data["gpu_type"],
        command=data["command"],
        env=data["env"],
        time_limit_s=data.get("time_limit_s"),
        checkpoint_dir=data["checkpoint_dir"],
        priority=data["priority"],
        leaf_locality=data["leaf_locality"],
        one_fabric=data["one_fabric"],
        one_per_node=data["one_per_node"],
        cpus_per_replica=data.get("cpus_per_replica"),
        memory_mb_per_replica=data.get("memory_mb_per_replica"),
        image=data.get("image", ""),
        container_mounts=data.get("container_mounts", []),
        container_workdir=data.get("container_workdir", ""),
    )


def _detail_queryset() -> QuerySet[Job]:
    tasks = Task.objects.select_related("node__leaf").prefetch_related(
        Prefetch("allocations", queryset=Allocation.objects.select_related("gpu"))
    )
    return Job.objects.select_related("team", "user").prefetch_related(Prefetch("tasks", queryset=tasks), "events")


def _as_submitted(job: Job) -> Job:
    """A job just made by job_submit, with what the detail serializer reads (no task yet, its one event)
    in place, so showing it costs no query (a submission at CI rates must not read back what it wrote)."""
    tasks = Task.objects.none()
    events = JobEvent.objects.filter(job=job)
    events._result_cache = [job.submit_event]  # type: ignore[attr-defined]
    events._prefetch_done = True  # type: ignore[attr-defined]
    job._prefetched_objects_cache = {"tasks": tasks, "events": events}  # type: ignore[attr-defined]
    return job


def _detail(request: Request, job: Job) -> dict[str, Any]:
    job = _detail_queryset().get(pk=job.pk)
    return cast(dict[str, Any], s.JobDetailOut(job, context={"viewer": request.user, "request": request}).data)


# --------------------------------------------------------------------------- jobs


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
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(jobs, request, view=self)
        return paginator.get_paginated_response(s.JobOut(page, many=True).data)

    def _create(self, request: Request) -> Response:
        body = self.input_serializer(data=request.data)
        body.is_valid(raise_exception=True)
        user = cast(User, request.user)  # IsAuthenticated let it through
        key = request.headers.get("Idempotency-Key") or None
        spec = _spec_from(body.validated_data, user=request.user, kind=self.kind)
        with _one_at_a_time(user, key):
            seen = key is not None and Job.objects.filter(user=user, idempotency_key=key).exists()
            job = _submit(user, spec, key=key)
        return Response(_detail(request, job), status=status.HTTP_200_OK if seen else status.HTTP_201_CREATED)


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
    OpenApiParameter("cursor", query_text("From the previous page's next/previous link", max_length=1000)),
    OpenApiParameter("page_size", {"type": "integer", "minimum": 1, "maximum": 200}, description="At most 200"),
]


# --------------------------------------------------------------------------- job files (scheduling/jobfiles/)


@dataclass(frozen=True)
class JobFileBody:
    """A request body that is a job file's text: YAML (ours or a Kubeflow manifest) or a Slurm script."""

    text: str
    script: bool


class TooLarge(exceptions.APIException):
    """A body over what the API accepts: 413, as portal/middleware.py answers for Django's own limit."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


class _TextParser(BaseParser):
    script = False

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:  # a JobFileBody
        raw = stream.read(jobfiles.MAX_FILE_BYTES + 1) if stream is not None else b""
        if len(raw) > jobfiles.MAX_FILE_BYTES:
            raise TooLarge(f"A job file is at most {jobfiles.MAX_FILE_BYTES // 1024} KiB: send a shorter one")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"A job file is UTF-8 text: byte {exc.start} is not") from None
        return JobFileBody(text=text, script=self.script)


class YamlParser(_TextParser):
    media_type = "application/yaml"


# The other names YAML and shell scripts go by, as editors, curl users and CI tools send them (DRF
# picks a parser by its one media_type).
class XYamlParser(_TextParser):
    media_type = "application/x-yaml"


class TextYamlParser(_TextParser):
    media_type = "text/yaml"


class TextXYamlParser(_TextParser):
    media_type = "text/x-yaml"


class ShellScriptParser(_TextParser):
    media_type = "text/x-shellscript"
    script = True


class XShParser(_TextParser):
    media_type = "application/x-sh"
    script = True


class TextXShParser(_TextParser):
    media_type = "text/x-sh"
    script = True


JOB_FILE_PARSERS = [YamlParser, XYamlParser, TextYamlParser, TextXYamlParser, ShellScriptParser, XShParser, TextXShParser]


class NeverRunnable(exceptions.APIException):
    """The admission check says the job can never run here (too big, a GPU type the cluster lacks, over a limit).

    ``fields`` names the field it is about where there is one (``gpu_type``), as a bad field's error does.
    """

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "never_runnable"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}


def _never_runnable(exc: ValidationError) -> NeverRunnable | None:
    """The ValidationError as a NeverRunnable when all it says is that the job can never run, else None.

    job_submit and _validate_spec say so with messages that start with NEVER_RUNS (scheduling/services/submit.py):
    a non-field one from the admission check, or one on gpu_type; a typed exception from the service would
    be cleaner, and this keeps the two in step meanwhile.
    """
    by_field = {("non_field_errors" if k == "__all__" else k): v for k, v in getattr(exc, "message_dict", {}).items()}
    messages = [m for ms in by_field.values() for m in ms]
    if not messages or not all(m.startswith(NEVER_RUNS) for m in messages):
        return None
    return NeverRunnable(messages[0], fields={k: v for k, v in by_field.items() if k != "non_field_errors"})


def _submit(user: User, spec: JobSpec, *, key: str | None = None, copied_from: Job | None = None) -> Job:
    """job_submit, with "can never run" told apart from bad fields (`yard submit --wait` exits with its own code)."""
    try:
        return job_submit(user=user, spec=spec, idempotency_key=key, copied_from=copied_from)
    except ValidationError as exc:
        never = _never_runnable(exc)
        if never is not None:
            raise never from None
        raise


@contextmanager
def _one_at_a_time(user: User, key: str | None) -> Iterator[None]:
    """Serialise the requests that carry one user's Idempotency-Key, so each tells a replay from a first.

    Without it six concurrent POSTs with one key all look for the key before any has created its job,
    one creates it, the others meet the unique constraint and return that job, and all six answer 201.
    Under the lock the first answers 201 and every later one finds the job and answers 200. PostgreSQL:
    a transaction-level advisory lock on the (user, key) pair (other keys and users never wait);
    SQLite (the demo) serialises writing transactions anyway.
    """
    with transaction.atomic():
        if key is not None and connection.vendor == "postgresql":
            digest = hashlib.blake2b(f"idempotency:{user.pk}:{key}".encode(), digest_size=8).digest()
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest, "big", signed=True)])
        yield


def _gpu_types() -> list[str]:
    """The GPU types this cluster knows (its nodes' and its quotas'): the partitions of a Slurm script."""
    types = set(Node.objects.values_list("gpu_type", flat=True)) | set(Quota.objects.values_list("gpu_type", flat=True))
    return sorted(t for t in types if t)


def _only_team(user: Any) -> str | None:
    teams = list(teams_submittable(user=user).filter(kind=UnitKind.TEAM).values_list("slug", flat=True)[:2])
    return teams[0] if len(teams) == 1 else None


def _translation(request: Request) -> jobfiles.Translation | None:
    """The job file in the request, translated; None for the API's own JSON body."""
    data = request.data
    defaults = {"team": request.query_params.get("team") or None, "name": request.query_params.get("name") or None}
    try:
        if isinstance(data, JobFileBody):
            translation = jobfiles.translate(fmt="slurm" if data.script else "auto", text=data.text, gpu_types=_gpu_types())
        elif isinstance(data, Mapping) and "format" in data:
            envelope = s.JobFileIn(data=data)
            envelope.is_valid(raise_exception=True)
            e = envelope.validated_data
            defaults = {"team": e.get("team") or defaults["team"], "name": e.get("name") or defaults["name"]}
            translation = jobfiles.translate(fmt=e["format"], text=e["file"], gpu_types=_gpu_types())
        elif isinstance(data, Mapping) and "apiVersion" in data:
            # a Kubeflow manifest (or a job file with its apiVersion) sent as JSON, as kubectl can
            translation = jobfiles.translate(fmt="auto", data=dict(data), gpu_types=_gpu_types())
        else:
            return None
    except jobfiles.JobFileInvalid as exc:
        # The translators are pure (no Django): their refusal becomes the API's field errors here, a 400 naming
        # each place in the file (scheduling/api/errors.py), as the service's ValidationErrors do.
        raise ValidationError(exc.message_dict) from exc
    jobfiles.apply_defaults(translation, only_team=lambda: _only_team(request.user), **defaults)
    return translation


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
        "that cannot be honoured is a 400 naming it; what is ignored without changing the result is in warnings.",
        request=_SUBMIT_REQUEST,
        parameters=[IDEMPOTENCY, *_FILE_PARAMS],
        responses={201: s.JobSubmitOut, 200: s.JobSubmitOut, 409: ERROR, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        fields, translation = _submission(request)
        user = cast(User, request.user)  # IsAuthenticated let it through
        key = request.headers.get("Idempotency-Key") or None
        spec = _spec_from(fields, user=request.user, kind=JobKind.BATCH)
        with _one_at_a_time(user, key):
            seen = key is not None and Job.objects.filter(user=user, idempotency_key=key).exists()
            job = _submit(user, spec, key=key)
        context = {
            "viewer": request.user,
            "request": request,
            "translated_from": translation.source if translation else None,
            "warnings": translation.warnings if translation else [],
        }
        # A job made by this request is shown as job_submit returned it (no task yet, its one event); a
        # replay is read back whole, as it may have run since.
        shown = _as_submitted(job) if not seen and hasattr(job, "submit_event") else _detail_queryset().get(pk=job.pk)
        out = s.JobSubmitOut(shown, context=context).data
        return Response(out, status=status.HTTP_200_OK if seen else status.HTTP_201_CREATED)


def _submission(request: Request) -> tuple[dict[str, Any], jobfiles.Translation | None]:
    """The job fields of a submit request (the API's JSON, or a job file translated), validated as the API does."""
    translation = _translation(request)
    if translation is None:
        body = s.JobSubmitIn(data=request.data)
        body.is_valid(raise_exception=True)
        return dict(body.validated_data), None
    body = s.JobSubmitIn(data=translation.fields)
    valid = body.is_valid()
    # "This field is required", said in the file's own terms (#SBATCH --account=TEAM)
    problems = {**({} if valid else jobfiles.located(body.errors, translation)), **jobfiles.missing_hints(translation)}
    if problems:
        raise ValidationError(problems)
    return dict(body.validated_data), translation


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


class NotebookListCreateView(_JobCollection):
    kind = JobKind.NOTEBOOK
    input_serializer = s.NotebookSubmitIn

    @extend_schema(operation_id="notebooks_list", parameters=_LIST_PARAMS, responses={200: s.JobOut(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        return self._list(request)

    @extend_schema(
        operation_id="notebooks_create",
        request=s.NotebookSubmitIn,
        parameters=[IDEMPOTENCY],
        responses={201: s.JobDetailOut, 200: s.JobDetailOut, 409: ERROR, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        return self._create(request)


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


class NotebookDetailView(JobDetailView):
    kind = JobKind.NOTEBOOK

    @extend_schema(operation_id="notebooks_retrieve", parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)


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


class NotebookStopView(JobCancelView):
    kind = JobKind.NOTEBOOK

    @extend_schema(operation_id="notebooks_stop", request=None, parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


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


class NotebookLogsView(JobLogsView):
    kind = JobKind.NOTEBOOK

    @extend_schema(operation_id="notebooks_logs", parameters=_LOG_PARAMS, responses={200: s.JobLogsOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)


# --------------------------------------------------------------------------- teams and me


class TeamQuotaView(ApiView):
    @extend_schema(operation_id="teams_quota", parameters=[ID_PARAM], responses={200: s.TeamQuotaOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        unit = access_unit(user=request.user, pk=pk)
        usage = team_quota_usage(team=unit)
        quotas = [{"gpu_type": t, **v} for t, v in sorted(usage.items())]
        return Response(s.TeamQuotaOut({"team": unit, "quotas": quotas}).data)


class MeView(ApiView):
    @extend_schema(operation_id="me", responses={200: s.MeOut, 401: ERROR, 429: ERROR})
    def get(self, request: Request) -> Response:
        user = request.user
        auth = request.auth
        if isinstance(auth, ApiToken):
            how = "service token" if auth.kind == TokenKind.SERVICE else "personal token"
        else:
            how = "session"
        out = {
            "id": user.pk,
            "username": user.get_username(),
            "is_cluster_admin": is_cluster_admin(user),
            "auth": how,
            "teams": list(teams_submittable(user=user).filter(kind=UnitKind.TEAM)),
            "roles": [{"unit": unit, "kind": unit.kind, "role": role} for unit, role in user_roles(user=user)],
        }
        return Response(s.MeOut(out).data)


class MyQuotaView(ApiView):
    @extend_schema(
        operation_id="me_quota",
        description="Your teams' guarantees, limits, GPUs in use and borrowed, and where each stands in fair share.",
        parameters=[OpenApiParameter("team", query_text("Only this one of your teams (id or slug)"))],
        responses={200: s.MyQuotaOut, **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = s.MyQuotaIn(data=request.query_params)
        params.is_valid(raise_exception=True)
        teams = teams_submittable(user=request.user).filter(kind=UnitKind.TEAM).order_by("path")
        if "team" in params.validated_data:
            team = _team_from_ref(params.validated_data["team"], user=request.user, candidates=teams)
            if team is None:
                raise ValidationError({"team": ["No such team, or not one of yours"]})
            teams = teams.filter(pk=team.pk)
        standing = fairshare_standing(now=timezone.now())
        out = []
        for team in teams:
            usage = team_quota_usage(team=team)
            quotas = [{"gpu_type": t, **v} for t, v in sorted(usage.items())]
            out.append({"team": team, "quotas": quotas, "fair_share": standing.get(team.pk)})
        half_life_days = yard_number("HALF_LIFE_S") / 86400
        return Response(s.MyQuotaOut({"teams": out, "half_life_days": half_life_days}).data)
