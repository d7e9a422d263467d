"""Writes to the org tree, quotas, memberships, tokens and SSH keys. Keyword-only, atomic, audited."""

from __future__ import annotations

import base64
import binascii
import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import Sum
from django.utils import timezone
from django.utils.text import slugify

from tenants.compiled import CompiledQuery
from tenants.models import (
    KIND_DEPTH,
    ApiToken,
    AuditEntry,
    Membership,
    OrgUnit,
    Quota,
    Role,
    SshKey,
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
    parent = unit.parent if unit.parent_id is not None else None
    check_quota(
        unit=unit,
        gpu_type=gpu_type,
        guaranteed=guaranteed,
        limit=limit,
        weight=weight,
        parent_guaranteed=_guaranteed(parent, gpu_type) if parent is not None else None,
        siblings_guaranteed=_children_guaranteed(parent, gpu_type, override={unit.pk: guaranteed}) if parent is not None else 0,
        children_guaranteed=_children_guaranteed(unit, gpu_type),
    )


def check_quota(
    *,
    unit: OrgUnit,
    gpu_type: str,
    guaranteed: int,
    limit: int | None,
    weight: float,
    parent_guaranteed: int | None,
    siblings_guaranteed: int,
    children_guaranteed: int,
) -> None:
    """The quota rules on given figures (the live tree's, or a draft's): ``parent_guaranteed`` None for
    the root; ``siblings_guaranteed`` the children of the parent with this unit's new value counted."""
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
    if parent_guaranteed is not None and siblings_guaranteed > parent_guaranteed:
        parent = unit.parent
        assert parent is not None
        raise ValidationError(
            {
                "guaranteed": f"{parent.name}'s children would hold {siblings_guaranteed} {gpu_type} of its "
                f"{parent_guaranteed} guaranteed; lower {unit.name}'s guarantee to at most "
                f"{parent_guaranteed - (siblings_guaranteed - guaranteed)} or raise {parent.name}'s"
            }
        )
    if children_guaranteed > guaranteed:
        raise ValidationError(
            {
                "guaranteed": f"{unit.name}'s children already hold {children_guaranteed} {gpu_type} guaranteed; "
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


# Every API request looks its token up: compiled once per thread (tenants/compiled.py), the same answer as
# ApiToken.objects.select_related("user").filter(token_hash=...).first().
_TOKEN_BY_HASH: CompiledQuery[ApiToken] = CompiledQuery(
    lambda token_hash: ApiToken.objects.select_related("user").filter(token_hash=token_hash).order_by("pk")[:1],
    "\x00token-hash-sentinel",
)


def token_authenticate(*, raw: str) -> ApiToken | None:
    """The active token for ``raw``, or None (unknown, revoked or expired)."""
    if not raw.startswith(TOKEN_PREFIX):
        return None
    found = _TOKEN_BY_HASH.objects(hash_token(raw))
    token = found[0] if found else None
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


# --------------------------------------------------------------------------- SSH keys


# The public key types a dev session's sshd accepts (docs/dev-sessions.md): OpenSSH's current defaults,
# hardware-backed (FIDO) keys, and RSA. DSA is gone from OpenSSH; certificates are not taken here.
SSH_KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "ssh-rsa",
)
SSH_RSA_MIN_BITS = 2048
SSH_KEY_MAX_CHARS = 16_384  # a 16384-bit RSA key is under 3000; anything longer is not one key
_PASTE_THE_PUB = "paste the public key: the one line of the .pub file, e.g. ~/.ssh/id_ed25519.pub"


@dataclass(frozen=True)
class ParsedSshKey:
    key_type: str
    public_key: str  # "<type> <base64>", without the comment
    fingerprint: str  # "SHA256:…" as ssh-keygen -l prints it
    comment: str


def ssh_key_fingerprint(blob: bytes) -> str:
    """The key's SHA256 fingerprint as `ssh-keygen -l` prints it: unpadded base64 of the blob's digest."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def _ssh_strings(blob: bytes) -> list[bytes]:
    """The blob's length-prefixed strings (RFC 4251): a key is a few of them, the first its type."""
    out, at = [], 0
    while at < len(blob):
        if at + 4 > len(blob):
            raise ValueError("truncated")
        size = int.from_bytes(blob[at : at + 4], "big")
        if at + 4 + size > len(blob):
            raise ValueError("truncated")
        out.append(blob[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def ssh_key_parse(text: str) -> ParsedSshKey:
    """OpenSSH's one-line public key, "<type> <base64> [comment]", checked; ValidationError on public_key if not.

    The base64 must decode to a key blob whose own type string is the one the line names (a line whose
    parts were pasted from two keys is refused), an RSA key must have at least 2048 bits, and a private
    key pasted by mistake is refused with a message saying so (it is never stored, nor echoed)."""

    def refuse(message: str) -> ValidationError:
        return ValidationError({"public_key": [message]})

    text = (text or "").strip()
    if not text:
        raise refuse(f"Give a key: {_PASTE_THE_PUB}")
    if "PRIVATE KEY" in text or text.startswith("PuTTY-User-Key-File"):
        raise refuse(
            "This is a private key, which must never leave your computer (it is not stored): "
            f"{_PASTE_THE_PUB}, or print it with ssh-keygen -y -f ~/.ssh/id_ed25519"
        )
    if text.startswith("---- BEGIN SSH2 PUBLIC KEY"):
        raise refuse("This is an RFC 4716 (SSH2) public key: convert it to OpenSSH's one line with ssh-keygen -i -f KEYFILE")
    if len(text) > SSH_KEY_MAX_CHARS:
        raise refuse(f"At most {SSH_KEY_MAX_CHARS} characters: {_PASTE_THE_PUB}")
    if "\n" in text or "\r" in text:
        raise refuse(f"One key at a time, on one line: {_PASTE_THE_PUB}")
    parts = text.split(None, 2)
    key_type = parts[0]
    if key_type not in SSH_KEY_TYPES:
        if key_type == "ssh-dss":
            raise refuse("DSA keys are no longer accepted by OpenSSH: make an ed25519 key with ssh-keygen -t ed25519")
        if "-cert-v01@openssh.com" in key_type:
            raise refuse("This is an SSH certificate: add the public key itself")
        raise refuse(
            f"A key starts with its type, one of {', '.join(SSH_KEY_TYPES)} (no authorized_keys options): {_PASTE_THE_PUB}"
        )
    if len(parts) < 2:
        raise refuse(f"The key's base64 is missing after {key_type}: {_PASTE_THE_PUB}")
    encoded = parts[1]
    try:
        blob = base64.b64decode(encoded, validate=True)
        strings = _ssh_strings(blob)
    except (binascii.Error, ValueError):
        raise refuse(f"The key's base64 does not decode to a key: {_PASTE_THE_PUB}") from None
    if not strings or strings[0] != key_type.encode():
        raise refuse(f"The key's data is not an {key_type} key: the line mixes two keys, or was cut; {_PASTE_THE_PUB}")
    if key_type == "ssh-rsa":
        bits = int.from_bytes(strings[2], "big").bit_length() if len(strings) >= 3 else 0
        if bits < SSH_RSA_MIN_BITS:
            raise refuse(f"An RSA key of {bits} bits is too weak: use {SSH_RSA_MIN_BITS} bits or more, or an ed25519 key")
    return ParsedSshKey(
        key_type=key_type,
        public_key=f"{key_type} {encoded}",
        fingerprint=ssh_key_fingerprint(blob),
        comment=parts[2].strip() if len(parts) > 2 else "",
    )


@transaction.atomic
def ssh_key_add(*, user: User, name: str, public_key: str) -> SshKey:
    """Add a public key to ``user``'s; their dev sessions let it in from their next heartbeat on.

    ``name`` may be empty: the key's comment names it then (user@host, as ssh-keygen writes it), else its type."""
    parsed = ssh_key_parse(public_key)
    name = (name or "").strip() or parsed.comment[:100] or parsed.key_type
    if len(name) > 100:
        raise ValidationError({"name": ["At most 100 characters"]})
    same = SshKey.objects.filter(user=user, fingerprint=parsed.fingerprint).first()
    if same is not None:
        raise ValidationError({"public_key": [f"You have added this key already, as “{same.name}” ({parsed.fingerprint})"]})
    try:
        with transaction.atomic():
            key = SshKey.objects.create(
                user=user, name=name, key_type=parsed.key_type, public_key=parsed.public_key, fingerprint=parsed.fingerprint
            )
    except IntegrityError:  # the same key added twice at once: one wins
        raise ValidationError({"public_key": [f"You have added this key already ({parsed.fingerprint})"]}) from None
    audit(actor=user, action="ssh_key.add", obj=key, message=f"SSH key {name} ({parsed.key_type} {parsed.fingerprint})")
    return key


@transaction.atomic
def ssh_key_delete(*, user: User, key: SshKey) -> None:
    """Remove one of ``user``'s keys: their dev sessions stop letting it in from their next heartbeat."""
    if key.user_id != user.pk:
        raise ValidationError("Only its owner can remove an SSH key")
    audit(actor=user, action="ssh_key.delete", obj=key, message=f"SSH key {key.name} ({key.fingerprint})")
    key.delete()
