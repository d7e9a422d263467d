"""REST API v1, notebooks: the job views with kind=notebook, under their own operation ids.

Apart from jobs.py so that the API's modules follow its URLs (urls.py); each view here only names
its kind, its input and its schema, and jobs.py does the work.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api import serializers as s
from scheduling.api.base import ERROR, ERRORS, ID_PARAM, IDEMPOTENCY
from scheduling.api.jobs import _LIST_PARAMS, _LOG_PARAMS, JobCancelView, JobDetailView, JobLogsView, _JobCollection
from scheduling.models import JobKind


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


class NotebookDetailView(JobDetailView):
    kind = JobKind.NOTEBOOK

    @extend_schema(operation_id="notebooks_retrieve", parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)


class NotebookStopView(JobCancelView):
    kind = JobKind.NOTEBOOK

    @extend_schema(operation_id="notebooks_stop", request=None, parameters=[ID_PARAM], responses={200: s.JobDetailOut, **ERRORS})
    def post(self, request: Request, pk: int) -> Response:
        return super().post(request, pk)


class NotebookLogsView(JobLogsView):
    kind = JobKind.NOTEBOOK

    @extend_schema(operation_id="notebooks_logs", parameters=_LOG_PARAMS, responses={200: s.JobLogsOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return super().get(request, pk)
