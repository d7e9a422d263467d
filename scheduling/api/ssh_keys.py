"""REST API v1: the caller's SSH public keys (docs/dev-sessions.md), which their dev sessions' sshd lets in.

Each person sees and changes only their own keys: another person's key is a 404, as a missing one is
(access_ssh_key). Only public keys are taken; tenants/services.py checks and fingerprints them.
"""

from __future__ import annotations

from typing import Any, cast

from django.contrib.auth.models import User
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from scheduling.api.base import ERRORS, ID_PARAM, ApiView
from scheduling.api.serializers import _NO_NUL
from tenants.models import SshKey
from tenants.selectors import access_ssh_key, ssh_keys_of
from tenants.services import SSH_KEY_MAX_CHARS, SSH_KEY_TYPES, ssh_key_add, ssh_key_delete

_GIVE_A_KEY = "Give a key: paste the one line of your .pub file, e.g. ~/.ssh/id_ed25519.pub"


class SshKeyIn(serializers.Serializer[Any]):
    name = serializers.CharField(
        max_length=100,
        allow_blank=True,
        default="",
        validators=_NO_NUL,
        help_text="What it is, e.g. laptop; empty: the key's comment (user@host), else its type",
    )
    public_key = serializers.CharField(
        max_length=SSH_KEY_MAX_CHARS,
        validators=_NO_NUL,
        error_messages={"blank": _GIVE_A_KEY, "required": _GIVE_A_KEY},
        help_text="OpenSSH's one-line public key, '<type> <base64> [comment]' (the .pub file); "
        f"type one of {', '.join(SSH_KEY_TYPES)}",
    )


class SshKeyOut(serializers.ModelSerializer[Any]):
    class Meta:
        model = SshKey
        fields = ["id", "name", "key_type", "public_key", "fingerprint", "created_at", "last_used_at"]


class SshKeyListCreateView(ApiView):
    @extend_schema(operation_id="ssh_keys_list", responses={200: SshKeyOut(many=True), **ERRORS})
    def get(self, request: Request) -> Response:
        return Response(SshKeyOut(ssh_keys_of(user=request.user), many=True).data)

    @extend_schema(
        operation_id="ssh_keys_create",
        description="Add a public key to yours: your dev sessions let it in from their next heartbeat (a few seconds), "
        "running ones too. A private key, a key you added already, or one that does not decode is a 400 on public_key.",
        request=SshKeyIn,
        responses={201: SshKeyOut, **ERRORS},
    )
    def post(self, request: Request) -> Response:
        body = SshKeyIn(data=request.data)
        body.is_valid(raise_exception=True)
        key = ssh_key_add(user=cast(User, request.user), **body.validated_data)
        return Response(SshKeyOut(key).data, status=status.HTTP_201_CREATED)


class SshKeyDetailView(ApiView):
    @extend_schema(operation_id="ssh_keys_delete", parameters=[ID_PARAM], responses={204: None, **ERRORS})
    def delete(self, request: Request, pk: int) -> Response:
        key = access_ssh_key(user=request.user, pk=pk)
        ssh_key_delete(user=cast(User, request.user), key=key)
        return Response(status=status.HTTP_204_NO_CONTENT)
