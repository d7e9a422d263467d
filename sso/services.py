"""Sign-in by single sign-on: the local user for an identity, and their roles from the groups claim.

The rule for roles: **the group map owns the units it names.** At every sign-in, a user's memberships
on those units (and on the cluster root, if the map grants cluster_admin) are made exactly what their
groups give now: a role from a group they left is taken away, a new one is granted. Memberships on
units the map never names are left as people set them in the portal. The changes go through
tenants.services (membership_set / membership_remove), so each is audited like any other.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from sso.config import ROLE_RANK, Grant
from sso.discovery import sso_settings
from sso.models import OidcIdentity
from tenants.models import Membership, OrgUnit, Role, UnitKind
from tenants.services import membership_remove, membership_set

log = logging.getLogger(__name__)
ACTOR = "single sign-on"
_NOT_USERNAME = re.compile(r"[^\w.@+-]")


class SsoRefused(Exception):
    """The provider vouched for the person, but Yardmaster will not let them in; the message says why."""


@dataclass(frozen=True)
class SignIn:
    user: User
    refused: str  # empty: let them in


def _groups(claims: dict[str, Any], claim: str) -> list[str]:
    raw = claims.get(claim)
    if raw is None:
        return []
    if isinstance(raw, str):  # some providers send a single group as a string
        raw = [raw]
    if not isinstance(raw, list):
        return []
    return sorted({str(g) for g in raw})


def _username(claims: dict[str, Any], claim: str) -> str:
    raw = str(claims.get(claim) or claims.get("email") or claims["sub"])
    return _NOT_USERNAME.sub("-", raw.strip())[:150] or str(claims["sub"])[:150]


def _grants() -> tuple[Grant, ...]:
    return tuple(getattr(settings, "YARD_OIDC_GROUP_MAP", ()))


def _user_for(*, issuer: str, claims: dict[str, Any]) -> tuple[User, OidcIdentity]:
    subject = str(claims["sub"])
    identity = OidcIdentity.objects.select_for_update().select_related("user").filter(issuer=issuer, subject=subject).first()
    if identity is not None:
        return identity.user, identity
    user_model = get_user_model()
    username = _username(claims, sso_settings().username_claim)
    existing = user_model.objects.filter(username=username).first()
    if existing is not None:
        # Link a local account of the same name (moving a team from local passwords to SSO keeps their
        # jobs), but never a staff account or one already linked to another identity: that would let a
        # provider account named "admin" become the portal's admin.
        if existing.is_staff or existing.is_superuser or OidcIdentity.objects.filter(user=existing).exists():
            raise SsoRefused(
                f"A local account named {username!r} already exists and cannot be linked to your sign-in automatically; "
                "ask a cluster admin to link it (Django admin → OIDC identities)."
            )
        user = existing
    else:
        user = user_model.objects.create_user(username=username)
        user.set_unusable_password()  # it signs in through the provider only
        user.save(update_fields=["password"])
    identity = OidcIdentity.objects.create(user=user, issuer=issuer, subject=subject)
    return user, identity


def _update_profile(user: User, claims: dict[str, Any]) -> None:
    fields = {"email": claims.get("email"), "first_name": claims.get("given_name"), "last_name": claims.get("family_name")}
    changed = [name for name, value in fields.items() if isinstance(value, str) and value and getattr(user, name) != value]
    for name in changed:
        setattr(user, name, str(fields[name])[: 150 if name != "email" else 254])
    if changed:
        user.save(update_fields=changed)


def memberships_from_groups(*, user: User, groups: list[str]) -> dict[int, str]:
    """Apply the group map to ``user``; returns {unit id: role} of the units the map owns that they now hold."""
    grants = _grants()
    slugs = {g.unit for g in grants if g.unit}
    units = {u.slug: u for u in OrgUnit.objects.filter(slug__in=slugs)}
    root = OrgUnit.objects.filter(kind=UnitKind.ROOT).first()
    owned = {u.pk for u in units.values()} | ({root.pk} if root is not None and any(g.unit is None for g in grants) else set())
    desired: dict[int, tuple[OrgUnit, str]] = {}
    member_of = set(groups)
    for grant in grants:
        if grant.group not in member_of:
            continue
        unit = root if grant.unit is None else units.get(grant.unit)
        if unit is None:
            log.warning("YARD_OIDC_GROUP_MAP: group %s names unit %r, which does not exist; skipped", grant.group, grant.unit)
            continue
        held = desired.get(unit.pk)
        if held is None or ROLE_RANK[grant.role] > ROLE_RANK[held[1]]:
            desired[unit.pk] = (unit, grant.role)
    current = {m.unit_id: m for m in Membership.objects.filter(user=user, unit_id__in=owned).select_related("unit")}
    for unit_id, membership in current.items():
        if unit_id not in desired:
            membership_remove(actor=None, actor_label=ACTOR, user=user, unit=membership.unit)
    held_now: dict[int, str] = {}
    for unit_id, (unit, role) in desired.items():
        if unit_id in current and current[unit_id].role == role:
            held_now[unit_id] = role
            continue
        try:
            membership_set(actor=None, user=user, unit=unit, role=Role(role))
        except ValidationError as exc:
            # e.g. "member" of a department: the map is wrong, the person is not; say it in the log.
            log.warning("YARD_OIDC_GROUP_MAP: %s on %s is not possible (%s); skipped", role, unit.slug, "; ".join(exc.messages))
            continue
        held_now[unit_id] = role
    return held_now


def sso_sign_in(*, issuer: str, claims: dict[str, Any]) -> SignIn:
    """The local user for these verified claims, their roles re-applied from the groups claim.

    Roles are applied and committed even when the sign-in is then refused: someone who left every
    mapped group must lose what those groups gave (their API tokens too), not keep it because they
    were turned away at the door.
    """
    if not claims.get("sub"):
        raise SsoRefused("The identity provider sent no subject (sub) for your account; ask your administrator.")
    config = sso_settings()
    groups = _groups(claims, config.groups_claim)
    with transaction.atomic():
        user, identity = _user_for(issuer=issuer, claims=claims)
        if not user.is_active:
            raise SsoRefused(f"The Yardmaster account {user.get_username()!r} is disabled; ask a cluster admin.")
        _update_profile(user, claims)
        memberships_from_groups(user=user, groups=groups)
        identity.groups = groups
        identity.last_login_at = timezone.now()
        identity.save(update_fields=["groups", "last_login_at"])
    if user.is_superuser or Membership.objects.filter(user=user).exists():
        return SignIn(user=user, refused="")
    shown = ", ".join(groups[:10]) + (" …" if len(groups) > 10 else "") if groups else f"none (no {config.groups_claim!r} claim)"
    return SignIn(
        user=user,
        refused=(
            f"You signed in as {user.get_username()}, but you are in none of the groups that give access to a team "
            f"here (your groups: {shown}). Ask your administrator to add you to your team's group."
        ),
    )
