"""REST API v1, job arrays: one array as a whole (its tasks per state), its limit on tasks running at once,
and cancelling all of it.

Its tasks are jobs, read, followed and cancelled one by one under /jobs (GET /jobs?array={id} lists
them); an array is made by POST /jobs with ``array``. Its id is its first task's job id, so the access
check is that job's (access_array: the same 404 for another tenant's array as for none).
"""

from __future__ import annotations

from typing import cast

from django.contrib.auth.models import User
from drf_spectacular.utils import extend_schema
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api import serializers as s
from scheduling.api.base import ERRORS, ID_PARAM, ApiView
from scheduling.api.jobs import array_out
from scheduling.selectors import access_array
from scheduling.services import job_array_cancel, job_array_throttle


class JobArrayDetailView(ApiView):
    @extend_schema(operation_id="arrays_retrieve", parameters=[ID_PARAM], responses={200: s.JobArrayOut, **ERRORS})
    def get(self, request: Request, pk: int) -> Response:
        return Response(s.JobArrayOut(array_out(access_array(user=request.user, pk=pk))).data)

    @extend_schema(
        operation_id="arrays_throttle",
        description="Change the most tasks running at once, as scontrol update ArrayTaskThrottle: raised, the next "
        "cycle starts more; lowered, none is stopped and no more start until fewer run; null: no limit.",
        request=s.JobArrayThrottleIn,
        parameters=[ID_PARAM],
        responses={200: s.JobArrayOut, **ERRORS},
    )
    def patch(self, request: Request, pk: int) -> Response:
        array = access_array(user=request.user, pk=pk, manage=True)
        body = s.JobArrayThrottleIn(data=request.data)
        body.is_valid(raise_exception=True)
        if "max_running" in body.validated_data:  # a PATCH changes what it names, and nothing else
            array = job_array_throttle(
                array=array, max_running=body.validated_data["max_running"], actor=cast(User, request.user)
            )
        return Response(s.JobArrayOut(array_out(array)).data)


class JobArrayCancelView(ApiView):
    @extend_schema(
        operation_id="arrays_cancel",
        description="Cancel every task of the array, as scancel of its id: pending tasks at once, running ones "
        "get SIGTERM, their grace, then SIGKILL. One task alone: POST /api/v1/jobs/{task id}/cancel.",
        request=None,
        parameters=[ID_PARAM],
        responses={200: s.JobArrayCancelOut, **ERRORS},
    )
    def post(self, request: Request, pk: int) -> Response:
        array = access_array(user=request.user, pk=pk, manage=True)
        cancelled = job_array_cancel(array=array, actor=cast(User, request.user))
        return Response(s.JobArrayCancelOut(array_out(array) | {"cancelled": cancelled}).data)
