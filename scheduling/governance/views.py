"""Governance pages and endpoints: the monthly report (page, CSVs, API), idle extension, /metrics."""

from __future__ import annotations

import hmac
import os
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from prometheus_client import CONTENT_TYPE_LATEST
from rest_framework import serializers as drf_serializers
from rest_framework import status
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import IsAuthenticated
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from scheduling.governance.accounting import Month, month_of, parse_month
from scheduling.governance.fairshare import fairshare_explain, fairshare_teams
from scheduling.governance.metrics import render_metrics
from scheduling.governance.reaper import notebook_extend_idle
from scheduling.governance.reports import (
    JOB_COLUMNS,
    UNIT_COLUMNS,
    Report,
    build_report,
    daily_usage_svg,
    job_rows,
    to_csv,
    top_units,
    unit_rows,
    used_vs_guaranteed_svg,
)
from scheduling.selectors import access_job
from tenants.authentication import ApiTokenAuthentication
from tenants.models import OrgUnit
from tenants.selectors import access_unit, is_cluster_admin, units_visible

# --------------------------------------------------------------------------- the report's inputs


class BadReportRequest(Exception):
    pass


def _report_for(user: Any, params: Any) -> Report:
    """Parse ``month`` and ``unit`` and build the report the user may see (404 for a unit they may not)."""
    now = timezone.now()
    month_text = params.get("month") or ""
    try:
        month: Month = parse_month(month_text) if month_text else month_of(now)
    except ValueError as exc:
        raise BadReportRequest(str(exc)) from None
    unit_text = params.get("unit") or ""
    tops: Sequence[OrgUnit]
    if unit_text:
        if not unit_text.isdigit():
            raise BadReportRequest(f"unit must be a unit id (a number), not {unit_text!r}")
        tops = [access_unit(user=user, pk=unit_text)]
    else:
        tops = top_units(units_visible(user=user))
    return build_report(month=month, tops=tops, now=now)


def _csv_response(body: str, filename: str) -> HttpResponse:
    response = HttpResponse(body, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _scope(report: Report) -> str:
    return "-".join(t.unit.slug for t in report.tops) if len(report.tops) == 1 else "visible"


# --------------------------------------------------------------------------- pages


# In a month's first days the report page opens on the month before (saying so): a person opening it on
# the 2nd wants last month's figures, not a day's. The CSVs and the API keep "this month" as their default.
YOUNG_MONTH_DAYS = 3


@login_required
@require_GET
def report_page(request: HttpRequest) -> HttpResponse:
    params = request.GET.copy()
    now_local = timezone.localtime(timezone.now())
    opened_on_previous = False
    if not params.get("month") and now_local.day <= YOUNG_MONTH_DAYS:
        params["month"] = month_of(now_local).previous().label
        opened_on_previous = True
    try:
        report = _report_for(request.user, params)
    except BadReportRequest as exc:
        return render(request, "governance/report.html", {"error": str(exc)}, status=400)
    visible = units_visible(user=request.user).order_by("path")
    return render(
        request,
        "governance/report.html",
        {
            "report": report,
            "nodes": report.nodes(),
            "units": visible,
            "selected_unit": request.GET.get("unit", ""),
            "daily_svg": daily_usage_svg(report),
            "guarantee_svg": used_vs_guaranteed_svg(report),
            "is_admin": is_cluster_admin(request.user),
            "query": params.urlencode(),  # the CSV links name the month shown
            "opened_on_previous": opened_on_previous,
            "time_zone": timezone.get_default_timezone_name(),
        },
    )


def _report_csv(
    request: HttpRequest, *, rows: Callable[[Report], list[dict[str, Any]]], columns: Sequence[str], kind: str
) -> HttpResponse:
    try:
        report = _report_for(request.user, request.GET)
    except BadReportRequest as exc:
        return HttpResponse(str(exc), status=400, content_type="text/plain")
    return _csv_response(to_csv(rows(report), columns), f"{kind}-{_scope(report)}-{report.month.label}.csv")


@login_required
@require_GET
def report_units_csv(request: HttpRequest) -> HttpResponse:
    return _report_csv(request, rows=unit_rows, columns=UNIT_COLUMNS, kind="usage")


@login_required
@require_GET
def report_jobs_csv(request: HttpRequest) -> HttpResponse:
    return _report_csv(request, rows=job_rows, columns=JOB_COLUMNS, kind="jobs")


@login_required
@require_POST
def notebook_extend_idle_view(request: HttpRequest, pk: int) -> HttpResponse:
    job = access_job(user=request.user, pk=pk)
    if job.user_id != request.user.pk:
        # Visible but not theirs (a teammate's notebook): the extension is the owner's call alone.
        raise PermissionDenied("Only the notebook's owner can extend its idle timeout")
    try:
        notebook_extend_idle(job=job, user=request.user, now=timezone.now())
        messages.success(request, f"{job.name}: idle timeout extended")
    except ValidationError as exc:
        messages.error(request, " ".join(exc.messages))
    target = request.POST.get("next", "")
    return redirect(target if target.startswith("/") and not target.startswith("//") else "dashboard")


# --------------------------------------------------------------------------- API


class CSVRenderer(BaseRenderer):
    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if isinstance(data, dict) and "rows" in data:
            return to_csv(data["rows"], UNIT_COLUMNS).encode()
        detail = data.get("detail", "") if isinstance(data, dict) else str(data)
        return to_csv([{"detail": str(detail)}], ["detail"]).encode()


class UsageReportAPI(APIView):
    """GET /api/v1/reports/usage?month=YYYY-MM&unit=<id>: the report's rows, as JSON or CSV (?format=csv or Accept: text/csv)."""

    schema_parameters = [
        OpenApiParameter(
            "month",
            {"type": "string", "pattern": "^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])$"},
            description="YYYY-MM in the cluster's time zone; default: this month",
        ),
        OpenApiParameter(
            "unit", {"type": "integer", "minimum": 1}, description="the subtree's top unit; default: every unit you may see"
        ),
    ]

    authentication_classes = [ApiTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]
    renderer_classes = [JSONRenderer, CSVRenderer]

    @extend_schema(
        operation_id="reports_usage",
        parameters=schema_parameters,
        responses={
            200: inline_serializer(
                "UsageReport",
                fields={
                    "month": drf_serializers.CharField(),
                    "time_zone": drf_serializers.CharField(),
                    "hours_in_month": drf_serializers.FloatField(),
                    "units": drf_serializers.ListField(child=drf_serializers.IntegerField()),
                    "totals": drf_serializers.DictField(child=drf_serializers.FloatField()),
                    "rows": drf_serializers.ListField(child=drf_serializers.DictField()),
                },
            ),
            400: OpenApiResponse(description="a bad month or unit parameter"),
            404: OpenApiResponse(description="no such unit, or not yours to see"),
        },
    )
    def get(self, request: Request) -> Response:
        empty = [name for name in ("month", "unit") if name in request.query_params and not request.query_params[name]]
        if empty:  # the schema's types say "given"; leaving a parameter out is how to get the default
            return Response({"detail": f"{empty[0]}: give a value, or leave the parameter out"}, status=400)
        try:
            report = _report_for(request.user, request.query_params)
        except BadReportRequest as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
        except Http404:
            return Response({"detail": "No such unit"}, status=status.HTTP_404_NOT_FOUND)
        total = report.total
        return Response(
            {
                "month": report.month.label,
                "time_zone": timezone.get_default_timezone_name(),
                "hours_in_month": report.month.hours,
                "units": [t.unit.pk for t in report.tops],
                "totals": {
                    "guaranteed_gpu_hours": round(report.guaranteed_gpu_hours, 4),
                    "used_gpu_hours": round(total.used_gpu_hours, 4),
                    "borrowed_gpu_hours": round(total.borrowed_gpu_hours, 4),
                },
                "rows": unit_rows(report),
            }
        )


class FairShareAPI(APIView):
    """GET /api/v1/fairshare?team=<id or slug>: where each of my teams (or the one named) stands in fair
    share, level by level up the tree, and what would change it (the fair-share page's figures)."""

    authentication_classes = [ApiTokenAuthentication, SessionAuthentication]
    permission_classes = [IsAuthenticated]

    @extend_schema(
        operation_id="fairshare",
        parameters=[OpenApiParameter("team", str, description="a team id or slug you may see; default: your teams")],
        responses={
            200: inline_serializer(
                "FairShare",
                fields={
                    "half_life_days": drf_serializers.FloatField(),
                    "capacity": drf_serializers.DictField(child=drf_serializers.IntegerField()),
                    "teams": drf_serializers.ListField(child=drf_serializers.DictField()),
                },
            ),
            400: OpenApiResponse(description="team is not a team id or slug (a NUL byte, or over 100 characters)"),
            404: OpenApiResponse(description="no such team, or not yours to see"),
        },
    )
    def get(self, request: Request) -> Response:
        team = str(request.query_params.get("team", "")).strip()
        if "\x00" in team or len(team) > 100:
            return Response({"detail": "team must be a team id or slug"}, status=status.HTTP_400_BAD_REQUEST)
        try:
            teams = fairshare_teams(user=request.user, team=team)
        except Http404:
            return Response({"detail": "No such team"}, status=status.HTTP_404_NOT_FOUND)
        return Response(fairshare_explain(teams=teams, now=timezone.now()).as_dict())


# --------------------------------------------------------------------------- metrics


def _metrics_allowed(request: HttpRequest) -> bool:
    user = request.user
    if user.is_authenticated and (user.is_staff or is_cluster_admin(user)):
        return True
    # Read at request time, from the environment alone (not settings), so a token can be rotated
    # by restarting with a new YARD_METRICS_TOKEN; an empty one allows no bearer access.
    token = os.environ.get("YARD_METRICS_TOKEN", "")
    header = request.headers.get("Authorization", "")
    scheme, _, given = header.partition(" ")
    return bool(token) and scheme == "Bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not _metrics_allowed(request):
        response = HttpResponse("metrics need a staff session or the bearer token YARD_METRICS_TOKEN\n", status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    return HttpResponse(render_metrics(now=timezone.now()), content_type=CONTENT_TYPE_LATEST)
