"""One error shape for the user API: {"code": "...", "message": "...", "fields": {"replicas": ["..."]}}.

Services raise Django's ValidationError / PermissionDenied / Http404; DRF raises its own. Both
become the same JSON here, so a CI script reads one shape. Anything else is a bug and a 500 —
the schemathesis test exists to keep that from happening for any input.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import NON_FIELD_ERRORS
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from scheduling.services import IdempotencyConflict

_NON_FIELD = "non_field_errors"


def _flatten(detail: Any) -> list[str]:
    if isinstance(detail, dict):
        return [f"{k}: {m}" for k, v in detail.items() for m in _flatten(v)]
    if isinstance(detail, list):
        return [m for item in detail for m in _flatten(item)]
    return [str(detail)]


def _fields(detail: Any) -> dict[str, list[str]]:
    if isinstance(detail, dict):
        return {(_NON_FIELD if k == NON_FIELD_ERRORS else str(k)): _flatten(v) for k, v in detail.items()}
    return {_NON_FIELD: _flatten(detail)}


def _body(code: str, message: str, fields: dict[str, list[str]] | None = None) -> dict[str, Any]:
    return {"code": code, "message": message, "fields": fields or {}}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, IdempotencyConflict):
        return Response(
            _body(
                "idempotency_conflict",
                f"{exc}. Use a new Idempotency-Key for a new job, or resend the original body.",
                {"idempotency_key": [str(exc)]},
            )
            | {"job": exc.job.pk},
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, DjangoValidationError):
        detail = exc.message_dict if hasattr(exc, "error_dict") else {NON_FIELD_ERRORS: exc.messages}
        exc = exceptions.ValidationError(detail=detail)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound("Not found: no such object, or not one you can see")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied(str(exc) or None)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = _fields(exc.detail)
        first = next(iter(fields.items()), ("", ["invalid input"]))
        message = f"{first[0]}: {first[1][0]}" if first[0] != _NON_FIELD else first[1][0]
        response.data = _body("invalid", message, fields)
    elif isinstance(exc, exceptions.APIException):
        codes = exc.get_codes()
        code = codes if isinstance(codes, str) else exc.default_code
        # An exception may name the fields it is about (NeverRunnable: gpu_type), as a ValidationError does.
        named: dict[str, list[str]] | None = getattr(exc, "fields", None)
        response.data = _body(str(code), _flatten(exc.detail)[0] if exc.detail else str(exc), named)
    return response
