"""Bearer-token authentication of node agents (docs/agent-api.md, *Tokens*).

Two kinds of token, told apart by prefix: an enrolment token (``yen_``) may only register a new
node; a node token (``ynd_``) speaks for exactly one node on every other agent endpoint. Both are
stored hashed. The user API's authentication ignores these prefixes, and agent_credential is used by
the agent views alone, so neither kind of token opens anything outside /api/agent/v1/.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest
from django.utils import timezone

from scheduling.agent.tokens import ENROLMENT_PREFIX, NODE_PREFIX
from scheduling.models import EnrolmentToken, Node
from tenants.models import hash_token

__all__ = ["ENROLMENT_PREFIX", "NODE_PREFIX", "agent_credential", "bearer", "enrolment_lookup"]


def bearer(request: HttpRequest) -> str | None:
    header = str(request.META.get("HTTP_AUTHORIZATION", "")).split()
    if len(header) != 2 or header[0] != "Bearer":
        return None
    return str(header[1])


def enrolment_lookup(*, raw: str) -> EnrolmentToken | None:
    """The enrolment token ``raw`` stands for, if it may still register a node (not revoked, not
    expired, uses left: scheduling/agent/enrolment.py); else None.

    YARD["AGENT_ENROLMENT_TOKEN"] (from the environment) also enrols, so a deployment can bring up
    its first nodes before anyone signs in; its uses are counted in a row of its own, made at its first
    use, against YARD_AGENT_ENROLMENT_MAX_USES.
    """
    from scheduling.agent.enrolment import enrolment_configured, enrolment_live

    configured = settings.YARD["AGENT_ENROLMENT_TOKEN"]
    if configured and hmac.compare_digest(raw.encode(), str(configured).encode()):
        token = enrolment_configured(raw=raw)
        return enrolment_live(token_hash=token.token_hash)
    return enrolment_live(token_hash=hash_token(raw), now=timezone.now())


def agent_credential(request: HttpRequest) -> Node | EnrolmentToken | None:
    """The Node (node token) or the EnrolmentToken (enrolment token) the request's bearer token stands for."""
    raw = bearer(request)
    if raw is None:
        return None
    if raw.startswith(NODE_PREFIX):
        return Node.objects.filter(token_hash=hash_token(raw)).first()
    if raw.startswith(ENROLMENT_PREFIX):
        return enrolment_lookup(raw=raw)
    return None
