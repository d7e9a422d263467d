"""REST API v1 for people and CI: one view per operation; access_* selectors do the tenant check.

Views parse input, load objects through selectors (the same 404 for another tenant's object
as for a missing one), call one service and render. Services write the audit entries.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db.models import Prefetch, Q, QuerySet
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.api import serializers as s
from scheduling.api.errors import api_exception_handler
from scheduling.api.permissions import TokenRateThrottle
from scheduling.api.schema import ApiTokenScheme  # noqa: F401  (registers the auth scheme)
from scheduling.models import Allocation, Job, JobKind, Task
from scheduling.selectors import access_job, access_job_manage, jobs_visible, task_log_read, task_log_tail, team_quota_usage
from scheduling.services import JobSpec, job_cancel, job_submit
from tenants.models import ApiToken, OrgUnit, TokenKind, UnitKind
from tenants.selectors import access_unit, is_cluster_admin, teams_submittable, units_visible, user_roles

ERROR = OpenApiResponse(description='{"code": "...", "message": "...", "fields": {"field": ["..."]}}')
ERRORS = {400: ERROR, 401: ERROR, 403: ERROR, 404: ERROR, 429: ERROR}
ID_PARAM = OpenApiParameter("id", OpenApiTypes.INT, OpenApiParameter.PATH)
IDEMPOTENCY = OpenApiParameter(
    "Idempotency-Key",
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="A CI retry with the same key and body gets the same job (200), never a second one; "
    "the same key with another body is a 409.",
)


class ApiView(APIView):
    """The API's error shape and the per-token throttle for every view."""

    throttle_classes = [TokenRateThrottle]

    def get_exception_handler(self) -> Any:
        return api_exception_handler


class JobCursor(CursorPagination):
    ordering = "-id"  # ids grow with submission: a stable cursor even when many share a timestamp
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


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
    )


def _detail_queryset() -> QuerySet[Job]:
    tasks = Task.objects.select_related("node__leaf").prefetch_related(
        Prefetch("allocations", queryset=Allocation.objects.select_related("gpu"))
    )
    return Job.objects.select_related("team", "user").prefetch_related(Prefetch("tasks", queryset=tasks), "events")


def _detail(request: Request, job: Job) -> dict[str, Any]:
    job = _detail_queryset().get(pk=job.pk)
    return cast(dict[str, Any], s.JobDetailOut(job, context={"viewer": request.user}).data)


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
        seen = key is not None and Job.objects.filter(user=user, idempotency_key=key).exists()
        job = job_submit(user=user, spec=spec, idempotency_key=key)
        return Response(_detail(request, job), status=status.HTTP_200_OK if seen else status.HTTP_201_CREATED)


_LIST_PARAMS = [
    OpenApiParameter("state", OpenApiTypes.STR, description="One or more states, comma-separated"),
    OpenApiParameter("team", OpenApiTypes.STR, description="Team id or slug"),
    OpenApiParameter("user", OpenApiTypes.STR, description="Username"),
    OpenApiParameter("tier", OpenApiTypes.INT, enum=[1, 2, 3]),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="Submitted at or after"),
    OpenApiParameter("cursor", OpenApiTypes.STR, description="From the previous page's next/previous link"),
    OpenApiParameter("page_size", OpenApiTypes.INT, description="At most 200"),
]


class JobListCreateView(_JobCollection):
    @extend_schema(operation_id="jobs_list", parameters=_LIST_PARAMS, responses={200: s.JobOut(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        return self._list(request)

    @extend_schema(
        operation_id="jobs_create",
        request=s.JobSubmitIn,
        parameters=[IDEMPOTENCY],
        responses={201: s.JobDetailOut, 200: s.JobDetailOut, 409: ERROR, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        return self._create(request)


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


class NotebookStopView(JobCancelView):
    kind = JobKind.NOTEBOOK

    @extend_schema(operation_id="notebooks_stop", request=None, parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


_LOG_PARAMS = [
    ID_PARAM,
    OpenApiParameter("rank", OpenApiTypes.INT, description="Rank (default 0)"),
    OpenApiParameter("attempt", OpenApiTypes.INT, description="Attempt (default the current one)"),
    OpenApiParameter("offset", OpenApiTypes.INT, description="Text from this byte; follow with next_offset"),
    OpenApiParameter("tail", OpenApiTypes.INT, description="The last N lines (at most 10000)"),
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
