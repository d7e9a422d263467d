"""What every view of REST API v1 shares: the error shape, the per-token throttle, bounded JSON, pages.

Apart from the views so that each resource's module (jobs.py, notebooks.py, teams.py, registry.py)
builds on one base and the schema's shared parameters and error answers are written once; nothing
here knows a job.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions
from rest_framework.pagination import CursorPagination
from rest_framework.parsers import BaseParser, JSONParser
from rest_framework.request import Request
from rest_framework.views import APIView

from scheduling.api.errors import api_exception_handler
from scheduling.api.permissions import TokenRateThrottle, add_rate_limit_headers
from scheduling.api.schema import ApiTokenScheme  # noqa: F401  (registers the auth scheme)
from tenants.models import OrgUnit
from tenants.selectors import unit_ref_lookup

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
    return candidates.filter(unit_ref_lookup(ref)).first()
