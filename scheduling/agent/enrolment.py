"""Enrolment tokens: who may register new nodes, how many, until when, and whether an admin approves them first.

A leaked enrolment token must not let anyone add nodes without end (a rogue node receives other
teams' workloads and their data), so each token registers at most ``max_uses`` nodes (one by
default), until it expires, and may require a cluster admin's approval before a node it registered
gets work. The count is claimed with a conditional UPDATE inside the registration's transaction: two
agents racing for the last use get one node between them, and a registration that fails gives its
use back. Registration and approval are audited.

Approval reuses the node's hold (Node.hold_reason, the same as an admin's drain): a held node turns
DRAINING at its first heartbeat and takes no work until a cluster admin resumes it (the cluster page,
the admin's "approve" action or ``manage.py nodes resume NAME``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import cast

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest
from django.utils import timezone

from scheduling.agent import services
from scheduling.agent.tokens import new_enrolment_token
from scheduling.models import EnrolmentToken, Node
from tenants.models import hash_token
from tenants.services import audit

ENV_TOKEN_NAME = "YARD_AGENT_ENROLMENT_TOKEN"
AWAITING_APPROVAL = "awaiting a cluster admin's approval"


class EnrolmentRefused(Exception):
    """The token has registered all the nodes it may, expired or was revoked (between lookup and use)."""


def _live(now: datetime) -> Q:
    return Q(revoked_at__isnull=True, uses__lt=F("max_uses")) & (Q(expires_at__isnull=True) | Q(expires_at__gt=now))


def enrolment_live(*, token_hash: str, now: datetime | None = None) -> EnrolmentToken | None:
    """The enrolment token with that hash if it may still register a node, else None."""
    return EnrolmentToken.objects.filter(_live(now or timezone.now()), token_hash=token_hash).first()


def enrolment_configured(*, raw: str) -> EnrolmentToken:
    """The row that counts the uses of YARD_AGENT_ENROLMENT_TOKEN (made at its first use).

    Its allowance follows YARD_AGENT_ENROLMENT_MAX_USES (never below what it has used), so an operator
    who brings up a rack raises that and restarts, and lowers it again after.
    """
    wanted = int(cast(int, settings.YARD["AGENT_ENROLMENT_MAX_USES"]))
    approval = bool(settings.YARD["AGENT_REQUIRE_APPROVAL"])
    token, _ = EnrolmentToken.objects.get_or_create(
        token_hash=hash_token(raw), defaults={"name": ENV_TOKEN_NAME, "max_uses": wanted, "requires_approval": approval}
    )
    if token.max_uses != wanted or token.requires_approval != approval:
        EnrolmentToken.objects.filter(pk=token.pk).update(max_uses=Greatest(F("uses"), wanted), requires_approval=approval)
        token.refresh_from_db()
    return token


@transaction.atomic
def enrolment_token_create(
    *,
    actor: User | None,
    name: str,
    max_uses: int = 1,
    expires_in: timedelta | None = timedelta(hours=24),
    requires_approval: bool = False,
    actor_label: str | None = None,
) -> tuple[EnrolmentToken, str]:
    """A new enrolment token and its raw value (shown once; only its hash is kept)."""
    if max_uses < 1:
        raise ValueError("an enrolment token registers at least one node")
    raw = new_enrolment_token()
    now = timezone.now()
    token = EnrolmentToken.objects.create(
        name=name[:100],
        token_hash=hash_token(raw),
        created_at=now,
        expires_at=now + expires_in if expires_in is not None else None,
        max_uses=max_uses,
        requires_approval=requires_approval,
    )
    audit(
        actor=actor,
        actor_label=actor_label,
        action="enrolment.create",
        obj=token,
        message=f"{token.name}: up to {max_uses} node(s)"
        + (f", until {token.expires_at:%Y-%m-%d %H:%M} UTC" if token.expires_at else ", no expiry")
        + (", each approved by an admin" if requires_approval else ""),
        data={"max_uses": max_uses, "requires_approval": requires_approval},
    )
    return token, raw


@transaction.atomic
def node_enrol(
    *, enrolment: EnrolmentToken, registration: services.Registration, now: datetime | None = None
) -> tuple[Node, str]:
    """Claim one use of ``enrolment``, register the node (services.node_register), hold it for approval
    where the token or the deployment asks for that, and audit it. All or nothing.

    Raises EnrolmentRefused when the token has no use left (another registration took the last one),
    and services.NodeExists as node_register does (the use is given back with the rollback).
    """
    now = now or timezone.now()
    claimed = EnrolmentToken.objects.filter(_live(now), pk=enrolment.pk).update(uses=F("uses") + 1, last_used_at=now)
    if not claimed:
        raise EnrolmentRefused(enrolment.name)
    enrolment.refresh_from_db()
    node, raw = services.node_register(enrolment=enrolment, registration=registration, now=now)
    held = enrolment.requires_approval or bool(settings.YARD["AGENT_REQUIRE_APPROVAL"])
    if held:
        node.hold_reason = (
            f"{AWAITING_APPROVAL} (registered with enrolment token {enrolment.name!r}): "
            f"resume it on the cluster page or with `manage.py nodes resume {node.name}`"
        )[:255]
        Node.objects.filter(pk=node.pk).update(hold_reason=node.hold_reason)
    audit(
        actor=None,
        actor_label=f"agent {node.name}",
        action="node.register",
        obj=node,
        message=f"{node.name} registered with enrolment token {enrolment.name!r} "
        f"({enrolment.uses} of {enrolment.max_uses} used)" + ("; held until a cluster admin approves it" if held else ""),
        data={
            "enrolment_token": enrolment.pk,
            "uses": enrolment.uses,
            "max_uses": enrolment.max_uses,
            "address": node.address,
            "leaf": registration.leaf,
            "spine": registration.spine,
            "gpus": len(registration.gpus),
            "awaiting_approval": held,
        },
    )
    return node, raw


@transaction.atomic
def node_drain_requested(*, node: Node, reason: str) -> str:
    """An agent's own drain request (it could not stop a task, its GPUs fail): services.node_drain, audited
    when it changed the node's state or hold. Returns the node's state."""
    before = (node.state, node.hold_reason)
    state = services.node_drain(node=node, reason=reason)
    if (node.state, node.hold_reason) != before:
        audit(
            actor=None,
            actor_label=f"agent {node.name}",
            action="node.drain",
            obj=node,
            message=f"{node.name}: the agent asked for a drain: {reason}"[:1000],
            data={"from": before[0], "state": node.state},
        )
    return state
