"""REST API v1, dev sessions (docs/dev-sessions.md): the job views with kind=dev, under their own operation ids.

As notebooks.py: each view here only names its kind, its input and its schema, and jobs.py does the work.
A dev session's detail carries its ``ssh`` object (serializers.JobDetailOut.get_ssh): how to reach its sshd
through the portal's tunnel while it runs.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api import serializers as s
from scheduling.api.base import ERROR, ERRORS, ID_PARAM, IDEMPOTENCY
from scheduling.api.jobs import _LIST_PARAMS, _LOG_PARAMS, JobCancelView, JobDetailView, JobLogsView, _JobCollection
from scheduling.models import JobKind


class DevSessionListCreateView(_JobCollection):
    kind = JobKind.DEV
    input_serializer = s.DevSessionSubmitIn

    @extend_schema(operation_id="dev_sessions_list", parameters=_LIST_PARAMS, responses={200: s.JobOut(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        return self._list(request)

    @extend_schema(
        operation_id="dev_sessions_create",
        description="Launch a dev session: GPUs on one node and an SSH server for you alone (your SSH keys, "
        "/api/v1/ssh-keys), reached with `yard ssh <id>`; stopped when its GPUs sit idle, as a notebook is.",
        request=s.DevSessionSubmitIn,
        parameters=[IDEMPOTENCY],
        responses={201: s.JobDetailOut, 200: s.JobDetailOut, 409: ERROR, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        return self._create(request)


class DevSessionDetailView(JobDetailView):
    kind = JobKind.DEV

    @extend_schema(operation_id="dev_sessions_retrieve", parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)


class DevSessionStopView(JobCancelView):
    kind = JobKind.DEV

    @extend_schema(
        operation_id="dev_sessions_stop", request=None, parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS}
    )
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


class DevSessionLogsView(JobLogsView):
    kind = JobKind.DEV

    @extend_schema(operation_id="dev_sessions_logs", parameters=_LOG_PARAMS, responses={200: s.JobLogsOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)
