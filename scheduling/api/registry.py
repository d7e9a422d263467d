"""REST API v1: a team's container registry credentials (docs/containers.md, "Registry credentials").

Listed, set and deleted by those who administer the unit (its team lead, an org admin above it, a
cluster admin: scheduling/registry_credentials.py). The password is write-only: no answer holds it.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.base import ERRORS, ID_PARAM, ApiView
from scheduling.api.schema import query_text
from scheduling.api.serializers import _NO_NUL, QueryIn, TeamRefField, TeamRefOut
from scheduling.models import RegistryCredential
from scheduling.registry_credentials import (
    access_credential,
    credential_delete,
    credential_set,
    credentials_visible,
    units_credential_admin,
)  # fmt: skip
from tenants.models import OrgUnit


class CredentialIn(serializers.Serializer[Any]):
    unit = TeamRefField(max_length=100, validators=_NO_NUL, help_text="The team (or a unit above it): id or slug")
    registry = serializers.CharField(max_length=255, validators=_NO_NUL, help_text="host[:port], e.g. nvcr.io")
    username = serializers.CharField(max_length=255, validators=_NO_NUL)
    password = serializers.CharField(
        max_length=4096,
        write_only=True,
        trim_whitespace=False,
        validators=_NO_NUL,
        help_text="The password or access token: sealed at rest, never shown again",
    )


class CredentialListIn(QueryIn):
    unit = TeamRefField(max_length=100, required=False, validators=_NO_NUL, help_text="Only this unit's (id or slug)")


class CredentialOut(serializers.ModelSerializer[Any]):
    unit = TeamRefOut()
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)

    class Meta:
        model = RegistryCredential
        fields = ["id", "unit", "registry", "username", "created_by", "created_at", "updated_at"]


def _unit(ref: str, *, user: Any) -> OrgUnit:
    units = units_credential_admin(user=user)
    unit = units.filter(slug=ref).first() or (units.filter(pk=int(ref)).first() if ref.isdigit() and len(ref) < 19 else None)
    if unit is None:
        # The same answer for a unit elsewhere in the tree as for none: no probing.
        raise ValidationError({"unit": ["No such unit, or not one whose registry credentials you may manage"]})
    return unit


class RegistryCredentialListCreateView(ApiView):
    @extend_schema(
        operation_id="registry_credentials_list",
        parameters=[OpenApiParameter("unit", query_text("Only this unit's (id or slug)"))],
        responses={200: CredentialOut(many=True), **ERRORS},
    )
    def get(self, request: Request) -> Response:
        params = CredentialListIn(data=request.query_params)
        params.is_valid(raise_exception=True)
        credentials = credentials_visible(user=request.user)
        if "unit" in params.validated_data:
            credentials = credentials.filter(unit=_unit(params.validated_data["unit"], user=request.user))
        return Response(CredentialOut(credentials.order_by("unit__path", "registry"), many=True).data)

    @extend_schema(
        operation_id="registry_credentials_set",
        description="Set the unit's login to a registry (replacing the one it had for that registry, 200; a new one: "
        "201). Jobs of the unit's teams pull their images with the nearest unit's credential up the tree.",
        request=CredentialIn,
        responses={201: CredentialOut, 200: CredentialOut, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        body = CredentialIn(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        credential, created = credential_set(
            actor=cast(User, request.user),
            unit=_unit(data["unit"], user=request.user),
            registry=data["registry"],
            username=data["username"],
            password=data["password"],
        )
        return Response(CredentialOut(credential).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)


class RegistryCredentialDetailView(ApiView):
    @extend_schema(operation_id="registry_credentials_delete", parameters=[ID_PARAM], responses={204: None, **ERRORS})
    def delete(self, request: Request, pk: int) -> Response:
        credential = access_credential(user=request.user, pk=pk)
        credential_delete(actor=cast(User, request.user), credential=credential)
        return Response(status=status.HTTP_204_NO_CONTENT)
