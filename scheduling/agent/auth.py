"""Bearer-token authentication of node agents (docs/agent-api.md, *Tokens*).

Two kinds of token, told apart by prefix: an enrolment token (``yen_``) may only register a new
node; a node token (``ynd_``) speaks for exactly one node on every other agent endpoint. Both are
stored hashed. The user API's authentication ignores these prefixes, and these classes are set on
the agent views alone, so neither kind of token opens anything outside /api/agent/v1/.
"""

from __future__ import annotations

import hmac
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db.models import Q
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from scheduling.models import EnrolmentToken, Node
from tenants.models import hash_token

NODE_PREFIX = "ynd_"
ENROLMENT_PREFIX = "yen_"


def _bearer(request: Request) -> str | None:
    header = authentication.get_authorization_header(request).decode(errors="replace").split()
    if len(header) != 2 or header[0] != "Bearer":
        return None
    return header[1]


def enrolment_lookup(*, raw: str) -> EnrolmentToken | None:
    """The live enrolment token ``raw`` stands for, or None.

    YARD["AGENT_ENROLMENT_TOKEN"] (from the environment) also enrols, so a deployment can bring up
    its first nodes before anyone signs in; it is returned as an unsaved token.
    """
    configured = settings.YARD["AGENT_ENROLMENT_TOKEN"]
    if configured and hmac.compare_digest(raw.encode(), str(configured).encode()):
        return EnrolmentToken(name="YARD_AGENT_ENROLMENT_TOKEN", token_hash=hash_token(raw))
    now = timezone.now()
    return (
        EnrolmentToken.objects.filter(token_hash=hash_token(raw), revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
        .first()
    )


class AgentTokenAuthentication(authentication.BaseAuthentication):
    """Sets ``request.auth`` to the Node (node token) or the EnrolmentToken (enrolment token)."""

    def authenticate(self, request: Request) -> tuple[Any, Node | EnrolmentToken] | None:
        raw = _bearer(request)
        if raw is None:
            return None
        credential: Node | EnrolmentToken | None = None
        if raw.startswith(NODE_PREFIX):
            credential = Node.objects.filter(token_hash=hash_token(raw)).first()
        elif raw.startswith(ENROLMENT_PREFIX):
            credential = enrolment_lookup(raw=raw)
        if credential is None:
            raise exceptions.AuthenticationFailed("unknown or revoked agent token")
        return AnonymousUser(), credential

    def authenticate_header(self, request: Request) -> str:
        return "Bearer"


class IsNode(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, Node)


class IsEnrolment(permissions.BasePermission):
    def has_permission(self, request: Request, view: Any) -> bool:
        return isinstance(request.auth, EnrolmentToken)
