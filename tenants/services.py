"""Writes to the org tree, quotas, memberships and tokens. Keyword-only, atomic, audited."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.text import slugify

from tenants.models import (
    KIND_DEPTH,
    ApiToken,
    AuditEntry,
    Membership,
    OrgUnit,
    Quota,
    Role,
    TokenKind,
    UnitKind,
    hash_token,
)

TOKEN_PREFIX = "ym_"


def audit(
    *,
    actor: User | None,
    action: str,
    obj: object,
    message: str = "",
    unit: OrgUnit | None = None,
    data: dict[str, object] | None = None,
    actor_label: str | None = None,
) -> AuditEntry:
    label = actor_label or (actor.get_username() if actor is not None else "system")
    return AuditEntry.objects.create(
        actor=actor if actor is not None and actor.pk else None,
        actor_label=label,
        action=action,
        object_type=type(obj).__name__.lower(),
        object_id=str(getattr(obj, "pk", "")),
        unit=unit,
        message=message,
        data=data or {},
    )


# --------------------------------------------------------------------------- quota rules


def _guaranteed(unit: OrgUnit, gpu_type: str) -> int:
    quota = Quota.objects.filter(unit=unit, gpu_type=gpu_type).only("guaranteed").first()
    return quota.guaranteed if quota else 0


def _children_guaranteed(parent: OrgUnit, gpu_type: str, *, override: dict[int, int] | None = None) -> int:
    """Sum of the children's guarantees, with ``override`` {unit id: guaranteed} applied."""
    override = override or {}
    rows = Quota.objects.filter(unit__parent=parent, gpu_type=gpu_type).values_list("unit_id", "guaranteed")
    total = {unit_id: g for unit_id, g in rows}
    total.update({uid: g for uid, g in override.items()})
    return sum(total.values())


def validate_quota(*, unit: OrgUnit, gpu_type: str, guaranteed: int, limit: int | None, weight: float) -> None:
    """Raise ValidationError (with field keys) if these values would make the tree invalid."""
    errors: dict[str, str] = {}
    if guaranteed < 0:
        errors["guaranteed"] = f"{unit.name} {gpu_type}: guaranteed GPUs cannot be negative (got {guaranteed})"
    if limit is not None and limit < 0:
        errors["limit"] = f"{unit.name} {gpu_type}: the limit cannot be negative (got {limit})"
    elif limit is not None and limit < guaranteed:
        errors["limit"] = (
            f"{unit.name} {gpu_type}: the limit ({limit}) must be at least the guarantee ({guaranteed}); "
            "raise the limit or leave it empty for no limit"
        )
    if not weight > 0:
        errors["weight"] = f"{unit.name} {gpu_type}: the weight must be positive (got {weight})"
    if errors:
        raise ValidationError(errors)
    if unit.parent_id is not None:
        parent = unit.parent
        assert parent is not None
        parent_g = _guaranteed(parent, gpu_type)
        siblings = _children_guaranteed(parent, gpu_type, override={unit.pk: guaranteed})
        if siblings > parent_g:
            raise ValidationError(
                {
                    "guaranteed": f"{parent.name}'s children would hold {siblings} {gpu_type} of its {parent_g} "
                    f"guaranteed; lower {unit.name}'s guarantee to at most {parent_g - (siblings - guaranteed)} "
                    f"or raise {parent.name}'s"
                }
            )
    children = _children_guaranteed(unit, gpu_type)
    if children > guaranteed:
        raise ValidationError(
            {
                "guaranteed": f"{unit.name}'s children already hold {children} {gpu_type} guaranteed; "
                f"its own guarantee cannot drop to {guaranteed}"
            }
        )


_QUOTA_FIELDS = ("guaranteed", "limit", "weight")


def _quota_value(field: str, value: object) -> str:
    if value is None:
        return "no limit" if field == "limit" else "—"
    return f"{value:g}" if isinstance(value, float) else str(value)


def quota_change_words(before: Mapping[str, object], after: Mapping[str, object], *, created: bool) -> str:
    """A quota change as people read it: only the fields that changed, "no limit" for None ("limit no
    limit → 16, guaranteed 4 → 8"); a new quota says what it was set to ("new quota: guaranteed 8, no
    limit, weight 1")."""
    fields = [k for k in _QUOTA_FIELDS if k in after]
    if created:
        return "new quota: " + ", ".join(
            "no limit" if k == "limit" and after[k] is None else f"{k} {_quota_value(k, after[k])}" for k in fields
        )
    changes = [f"{k} {_quota_value(k, before.get(k))} → {_quota_value(k, after[k])}" for k in fields if before.get(k) != after[k]]
    return ", ".join(changes) or "saved unchanged"


@transaction.atomic
def quota_set(
    *,
    actor: User | None,
    unit: OrgUnit,
    gpu_type: str,
    guaranteed: int,
    limit: int | None = None,
    weight: float = 1.0,
) -> Quota:
    gpu_type = gpu_type.strip()
    if not gpu_type:
        raise ValidationError({"gpu_type": "Name a GPU type, e.g. H100"})
    # Serialise quota edits under one parent so two concurrent edits cannot both pass the sum check.
    OrgUnit.objects.select_for_update().filter(pk__in=[unit.pk, unit.parent_id or unit.pk]).exists()
    validate_quota(unit=unit, gpu_type=gpu_type, guaranteed=guaranteed, limit=limit, weight=weight)
    quota, created = Quota.objects.get_or_create(unit=unit, gpu_type=gpu_type)
    before = {"guaranteed": quota.guaranteed, "limit": quota.limit, "weight": quota.weight}
    quota.guaranteed, quota.limit, quota.weight = guaranteed, limit, weight
    quota.save()
    after = {"guaranteed": guaranteed, "limit": limit, "weight": weight}
    audit(
        actor=actor,
        action="quota.create" if created else "quota.update",
        obj=unit,
        unit=unit,
        message=f"{unit.name} {gpu_type}: {quota_change_words(before, after, created=created)}",
        data={"gpu_type": gpu_type, "before": before, "after": after},
    )
    return quota


# --------------------------------------------------------------------------- the tree


def _check_kind(kind: str, parent: OrgUnit | None) -> None:
    if kind == UnitKind.ROOT:
        if parent is not None:
            raise ValidationError({"parent": "The cluster root cannot have a parent"})
        return
    if parent is None:
        raise ValidationError({"parent": "Every unit but the cluster root needs a parent"})
    if KIND_DEPTH[UnitKind(kind)] <= KIND_DEPTH[UnitKind(parent.kind)]:
        raise ValidationError(
            {"parent": f"A {UnitKind(kind).label.lower()} cannot sit under {parent.name} ({parent.get_kind_display().lower()})"}
        )


def _unique_slug(name: str) -> str:
    base = slugify(name)[:90] or "unit"
    slug, n = base, 1
    while OrgUnit.objects.filter(slug=slug).exists():
        n += 1
        slug = f"{base}-{n}"
    return slug


@transaction.atomic
def unit_create(*, actor: User | None, name: str, kind: str, parent: OrgUnit | None) -> OrgUnit:
    name = name.strip()
    if not name:
        raise ValidationError({"name": "Give the unit a name"})
    _check_kind(kind, parent)
    if parent is not None and OrgUnit.objects.filter(parent=parent, name=name).exists():
        raise ValidationError({"name": f"{parent.name} already has a unit named {name}"})
    unit = OrgUnit.objects.create(name=name, slug=_unique_slug(name), kind=kind, parent=parent)
    unit.path = f"{parent.path if parent else '/'}{unit.pk}/"
    unit.save(update_fields=["path"])
    audit(actor=actor, action="unit.create", obj=unit, unit=unit, message=f"created {unit.get_kind_display().lower()} {name}")
    return unit


@transaction.atomic
def unit_move(*, actor: User | None, unit: OrgUnit, new_parent: OrgUnit) -> OrgUnit:
    """Move ``unit`` (and its subtree) under ``new_parent``, keeping every quota rule."""
    unit.refresh_from_db()
    new_parent.refresh_from_db()
    if unit.kind == UnitKind.ROOT:
        raise ValidationError({"parent": "The cluster root cannot be moved"})
    if new_parent.path.startswith(unit.path):
        raise ValidationError({"parent": f"{unit.name} cannot move under {new_parent.name}: that is inside its own subtree"})
    _check_kind(unit.kind, new_parent)
    for quota in Quota.objects.filter(unit=unit):
        parent_g = _guaranteed(new_parent, quota.gpu_type)
        siblings = _children_guaranteed(new_parent, quota.gpu_type) + quota.guaranteed
        if siblings > parent_g:
            raise ValidationError(
                {
                    "parent": f"{new_parent.name}'s children would hold {siblings} {quota.gpu_type} of its {parent_g} "
                    f"guaranteed if {unit.name} moved there"
                }
            )
    old_parent = unit.parent
    old_path, new_path = unit.path, f"{new_parent.path}{unit.pk}/"
    for descendant in OrgUnit.objects.filter(path__startswith=old_path).select_for_update():
        descendant.path = new_path + descendant.path[len(old_path) :]
        if descendant.pk == unit.pk:
            descendant.parent = new_parent
        descendant.save(update_fields=["path", "parent"])
    unit.refresh_from_db()
    audit(
        actor=actor,
        action="unit.move",
        obj=unit,
        unit=unit,
        message=f"moved {unit.name} from {old_parent} to {new_parent.name}",
        data={"from": old_parent.pk if old_parent else None, "to": new_parent.pk},
    )
    return unit


@transaction.atomic
def unit_delete(*, actor: User | None, unit: OrgUnit) -> None:
    if unit.kind == UnitKind.ROOT:
        raise ValidationError({"unit": "The cluster root cannot be removed"})
    if unit.children.exists():
        raise ValidationError({"unit": f"{unit.name} still has units under it; move or remove them first"})
    from django.apps import apps

    job_model = apps.get_model("scheduling", "Job")
    if job_model.objects.filter(team=unit).exists():
        raise ValidationError({"unit": f"{unit.name} has jobs on record; it cannot be removed (usage history)"})
    audit(actor=actor, action="unit.delete", obj=unit, unit=unit.parent, message=f"removed {unit.name}")
    unit.delete()


@transaction.atomic
def membership_set(*, actor: User | None, user: User, unit: OrgUnit, role: str) -> Membership:
    if role == Role.CLUSTER_ADMIN and unit.kind != UnitKind.ROOT:
        raise ValidationError({"role": "Cluster admins are members of the cluster root"})
    if role in (Role.MEMBER, Role.TEAM_LEAD) and unit.kind != UnitKind.TEAM:
        raise ValidationError({"role": f"{Role(role).label}s belong to a team, not a {unit.get_kind_display().lower()}"})
    membership, _ = Membership.objects.update_or_create(user=user, unit=unit, defaults={"role": role})
    audit(
        actor=actor,
        action="membership.set",
        obj=unit,
        unit=unit,
        message=f"{user.get_username()} is {Role(role).label} of {unit.name}",
    )
    return membership


@transaction.atomic
def membership_remove(*, actor: User | None, user: User, unit: OrgUnit, actor_label: str | None = None) -> bool:
    """Take ``user``'s role on ``unit`` away (single sign-on, when they left the group that gave it). True if they had one."""
    deleted, _ = Membership.objects.filter(user=user, unit=unit).delete()
    if deleted:
        audit(
            actor=actor,
            actor_label=actor_label,
            action="membership.remove",
            obj=unit,
            unit=unit,
            message=f"{user.get_username()} no longer holds a role on {unit.name}",
        )
    return bool(deleted)


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    raw: str  # shown once, never stored


def _new_raw_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(30)


@transaction.atomic
def token_create_personal(*, user: User, name: str, expires_at: datetime | None) -> IssuedToken:
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future"})
    raw = _new_raw_token()
    token = ApiToken.objects.create(
        kind=TokenKind.PERSONAL, name=name, user=user, prefix=raw[:10], token_hash=hash_token(raw), expires_at=expires_at
    )
    audit(actor=user, action="token.create", obj=token, message=f"personal token {name}")
    return IssuedToken(token=token, raw=raw)


@transaction.atomic
def token_create_service(*, actor: User | None, team: OrgUnit, name: str, expires_at: datetime | None) -> IssuedToken:
    from django.contrib.auth import get_user_model

    if team.kind != UnitKind.TEAM:
        raise ValidationError({"team": "Service-account tokens belong to a team"})
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationError({"expires_at": "The expiry must be in the future"})
    user_model = get_user_model()
    service_user, created = user_model.objects.get_or_create(username=f"svc-{team.slug}")
    if created:
        service_user.set_unusable_password()
        service_user.save()
        Membership.objects.create(user=service_user, unit=team, role=Role.MEMBER)
    raw = _new_raw_token()
    token = ApiToken.objects.create(
        kind=TokenKind.SERVICE,
        name=name,
        user=service_user,
        team=team,
        prefix=raw[:10],
        token_hash=hash_token(raw),
        expires_at=expires_at,
    )
    audit(actor=actor, action="token.create", obj=token, unit=team, message=f"service token {name} for {team.name}")
    return IssuedToken(token=token, raw=raw)


def token_authenticate(*, raw: str) -> ApiToken | None:
    """The active token for ``raw``, or None (unknown, revoked or expired)."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    token = ApiToken.objects.select_related("user").filter(token_hash=hash_token(raw)).first()
    now = timezone.now()
    if token is None or not token.is_active(now) or not token.user.is_active:
        return None
    # Coarse last-used stamp: one write per token per minute at most.
    if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token


@transaction.atomic
def token_revoke(*, actor: User | None, token: ApiToken) -> None:
    ApiToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
    audit(actor=actor, action="token.revoke", obj=token, message=f"revoked {token.prefix}…")


def guarantees_sum(*, parent: OrgUnit, gpu_type: str) -> int:
    return Quota.objects.filter(unit__parent=parent, gpu_type=gpu_type).aggregate(s=Sum("guaranteed"))["s"] or 0
