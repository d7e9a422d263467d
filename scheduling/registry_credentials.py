"""Registry credentials: a team's (or a department's, for every team below it) login to a container registry.

The password is sealed at rest (scheduling/sealed.py, its own purpose) and opened in one place only:
``credential_for_image``, when the portal builds the task spec an agent launches from. It is never
returned by the API, written to the audit log or put in an error message.

Who may manage a unit's credentials: its team lead, an org admin of it or of a unit above it, a
cluster admin, the people who administer that part of the tree.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils import timezone

from scheduling import images
from scheduling.models import RegistryCredential
from scheduling.sealed import open_sealed, seal
from tenants.models import OrgUnit, Role
from tenants.selectors import is_cluster_admin, teams_led, user_roles
from tenants.services import audit

_PURPOSE = b"yardmaster registry password v1"
MAX_PASSWORD = 4096


def units_credential_admin(*, user: User | AnonymousUser) -> QuerySet[OrgUnit]:
    """Units whose registry credentials the user may list, set and delete: a cluster admin's every unit, an org
    admin's unit and all below it, a team lead's team."""
    if is_cluster_admin(user):
        return OrgUnit.objects.all()
    # An org admin's unit and its whole subtree (its materialised path), and the teams the user leads.
    where = Q(pk__in=teams_led(user=user).values("pk"))
    for unit, role in user_roles(user=user):
        if role == Role.ORG_ADMIN:
            where |= Q(path__startswith=unit.path)
    return OrgUnit.objects.filter(where)


def credentials_visible(*, user: User | AnonymousUser) -> QuerySet[RegistryCredential]:
    return RegistryCredential.objects.filter(unit__in=units_credential_admin(user=user)).select_related("unit", "created_by")


def access_credential(*, user: User | AnonymousUser, pk: int) -> RegistryCredential:
    """The credential if the user may manage its unit; 404 (as for a missing one) otherwise."""
    credential = credentials_visible(user=user).filter(pk=pk).first()
    if credential is None:
        raise Http404("No such registry credential")
    return credential


@transaction.atomic
def credential_set(*, actor: User, unit: OrgUnit, registry: str, username: str, password: str) -> tuple[RegistryCredential, bool]:
    """The unit's credential for ``registry``, created or (the same unit and registry) replaced; (it, created).

    Raises ValidationError naming the field; never with the password in it."""
    errors: dict[str, list[str]] = {}
    try:
        host = images.parse_registry(registry)
    except images.ImageError as exc:
        errors["registry"] = [str(exc)]
    if not username.strip() or len(username) > 255 or "\x00" in username:
        errors["username"] = ["Give the registry's user name, at most 255 characters"]
    if not password or len(password) > MAX_PASSWORD or "\x00" in password:
        errors["password"] = [f"Give the password or access token, at most {MAX_PASSWORD} characters"]
    if errors:
        raise ValidationError(errors)
    now = timezone.now()
    sealed = seal(password, purpose=_PURPOSE)
    credential, created = RegistryCredential.objects.select_for_update().get_or_create(
        unit=unit,
        registry=host,
        defaults={"username": username, "password_sealed": sealed, "created_by": actor, "created_at": now, "updated_at": now},
    )
    if not created:
        RegistryCredential.objects.filter(pk=credential.pk).update(username=username, password_sealed=sealed, updated_at=now)
        credential.refresh_from_db()
    audit(
        actor=actor,
        action="registry_credential.create" if created else "registry_credential.replace",
        obj=credential,
        unit=unit,
        message=f"{username}@{host} for {unit.name}",
        data={"registry": host, "username": username},
    )
    return credential, created


@transaction.atomic
def credential_delete(*, actor: User, credential: RegistryCredential) -> None:
    audit(
        actor=actor,
        action="registry_credential.delete",
        obj=credential,
        unit=credential.unit,
        message=f"{credential.username}@{credential.registry} for {credential.unit.name}",
        data={"registry": credential.registry, "username": credential.username},
    )
    credential.delete()


def credential_for_image(*, team_id: int, image: str) -> dict[str, Any] | None:
    """The login for ``image``'s registry, opened, as the agent takes it (``{"username", "password"}``): the
    nearest unit's up the tree from the team (a team's own before its department's); None for none.

    Two queries: the team's materialised path names its ancestors. A credential sealed under a key no
    longer in SECRET_KEY / SECRET_KEY_FALLBACKS is not opened: the task goes without, and the registry
    says whether it needed one (the job fails IMAGE_PULL with its answer)."""
    try:
        registry = images.parse_image(image).registry
    except images.ImageError:
        return None
    path = OrgUnit.objects.filter(pk=team_id).values_list("path", flat=True).first() or ""
    ids = [int(x) for x in path.strip("/").split("/") if x] or [team_id]
    found = {c.unit_id: c for c in RegistryCredential.objects.filter(unit_id__in=ids, registry=registry)}
    for unit_id in reversed(ids):
        credential = found.get(unit_id)
        if credential is not None:
            password = open_sealed(credential.password_sealed, purpose=_PURPOSE)
            return None if password is None else {"username": credential.username, "password": password}
    return None
