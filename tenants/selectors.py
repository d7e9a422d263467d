"""Reads of the org tree with the tenant check built in.

Views never filter by tenant themselves: they call these, so none can forget the check.
Roles: members and team leads act on their team; org admins on their unit's whole subtree;
cluster admins (members of the root with that role) on everything.
"""

from __future__ import annotations

from functools import reduce
from operator import or_

from django.contrib.auth.models import AnonymousUser, User
from django.db.models import Q, QuerySet
from django.http import Http404

from tenants.compiled import CompiledQuery
from tenants.models import Membership, OrgUnit, Role, SshKey, UnitKind

AnyUser = User | AnonymousUser


# Read at every request that checks a permission (every submission): compiled once per thread
# (tenants/compiled.py), the same rows as Membership.objects.filter(user=user).select_related("unit").
_MEMBERSHIPS: CompiledQuery[Membership] = CompiledQuery(
    lambda user_id: Membership.objects.filter(user_id=user_id).select_related("unit"), -7_340_033
)


def _memberships(user: AnyUser) -> list[Membership]:
    if not user.is_authenticated:
        return []
    cached: list[Membership] | None = getattr(user, "_yard_memberships", None)
    if cached is None:
        cached = _MEMBERSHIPS.objects(user.pk)
        setattr(user, "_yard_memberships", cached)  # noqa: B010  # per-request cache
    return cached


def is_cluster_admin(user: AnyUser) -> bool:
    return bool(getattr(user, "is_superuser", False)) or any(m.role == Role.CLUSTER_ADMIN for m in _memberships(user))


def _subtree_q(units: list[OrgUnit], *, strict: bool = False) -> Q:
    if not units:
        return Q(pk__in=[])
    parts = [Q(path__startswith=u.path) & ~Q(pk=u.pk) if strict else Q(path__startswith=u.path) for u in units]
    return reduce(or_, parts)


def units_visible(*, user: AnyUser) -> QuerySet[OrgUnit]:
    """Units whose jobs, quotas and usage the user may read."""
    if is_cluster_admin(user):
        return OrgUnit.objects.all()
    ms = _memberships(user)
    admin_units = [m.unit for m in ms if m.role == Role.ORG_ADMIN]
    team_ids = [m.unit_id for m in ms if m.role in (Role.MEMBER, Role.TEAM_LEAD)]
    return OrgUnit.objects.filter(_subtree_q(admin_units) | Q(pk__in=team_ids))


def teams_visible(*, user: AnyUser) -> QuerySet[OrgUnit]:
    return units_visible(user=user).filter(kind=UnitKind.TEAM)


def teams_submittable(*, user: AnyUser) -> QuerySet[OrgUnit]:
    """Teams the user may submit jobs for (every visible team: members, leads, admins)."""
    return teams_visible(user=user)


def unit_ref_lookup(ref: str) -> Q:
    """The filter for a unit named by its id or its slug (an id too long for a bigint is a slug)."""
    return Q(slug=ref) | Q(pk=int(ref)) if ref.isdigit() and len(ref) < 19 else Q(slug=ref)


def may_submit_to(*, user: AnyUser, team: OrgUnit) -> bool:
    """Whether ``team`` is one of teams_submittable(user=user), decided from the user's memberships (read
    once per request) and the team's own kind and path, without a query: every submission asks it."""
    if team.kind != UnitKind.TEAM or not user.is_authenticated:
        return False
    if is_cluster_admin(user):
        return True
    return any(
        (m.role in (Role.MEMBER, Role.TEAM_LEAD) and m.unit_id == team.pk)
        or (m.role == Role.ORG_ADMIN and team.path.startswith(m.unit.path))
        for m in _memberships(user)
    )


def team_submittable(*, user: AnyUser, ref: str) -> OrgUnit | None:
    """The team of teams_submittable(user=user) that ``ref`` (an id or a slug) names, or None.

    The same answer as filtering that queryset by slug or id and taking the first by path; for a user
    who administers no unit (a CI token's service account, a researcher) the candidates are their own
    teams, already read with their memberships, so it costs no query."""
    ms = _memberships(user)
    if not user.is_authenticated or is_cluster_admin(user) or any(m.role == Role.ORG_ADMIN for m in ms):
        return teams_submittable(user=user).filter(unit_ref_lookup(ref)).first()
    pk = int(ref) if ref.isdigit() and len(ref) < 19 else None
    found = [
        m.unit
        for m in ms
        if m.role in (Role.MEMBER, Role.TEAM_LEAD) and m.unit.kind == UnitKind.TEAM and (m.unit.slug == ref or m.unit.pk == pk)
    ]
    return min(found, key=lambda u: (u.path, u.pk)) if found else None


def teams_led(*, user: AnyUser) -> QuerySet[OrgUnit]:
    """Teams whose every job the user may act on (cancel, requeue): leads and admins."""
    if is_cluster_admin(user):
        return OrgUnit.objects.filter(kind=UnitKind.TEAM)
    ms = _memberships(user)
    admin_units = [m.unit for m in ms if m.role == Role.ORG_ADMIN]
    lead_ids = [m.unit_id for m in ms if m.role == Role.TEAM_LEAD]
    return OrgUnit.objects.filter(kind=UnitKind.TEAM).filter(_subtree_q(admin_units) | Q(pk__in=lead_ids))


def units_administered(*, user: AnyUser) -> QuerySet[OrgUnit]:
    """Units whose quotas the user may edit: strictly below an org admin's unit; all for cluster admins.

    An org admin cannot raise their own unit's guarantee: that is their parent's admins' call.
    """
    if is_cluster_admin(user):
        return OrgUnit.objects.all()
    admin_units = [m.unit for m in _memberships(user) if m.role == Role.ORG_ADMIN]
    return OrgUnit.objects.filter(_subtree_q(admin_units, strict=True))


def admin_roots(*, user: AnyUser) -> list[OrgUnit]:
    """The top units of the subtrees the user administers (for the quota editor)."""
    if is_cluster_admin(user):
        return list(OrgUnit.objects.filter(kind=UnitKind.ROOT))
    return [m.unit for m in _memberships(user) if m.role == Role.ORG_ADMIN]


def access_unit(*, user: AnyUser, pk: int | str) -> OrgUnit:
    """The unit with ``pk`` if the user may read it; 404 (the same as a missing one) otherwise."""
    try:
        return units_visible(user=user).get(pk=pk)
    except (OrgUnit.DoesNotExist, ValueError):
        raise Http404("No such unit") from None


def access_unit_admin(*, user: AnyUser, pk: int | str) -> OrgUnit:
    try:
        return units_administered(user=user).get(pk=pk)
    except (OrgUnit.DoesNotExist, ValueError):
        raise Http404("No such unit") from None


def user_roles(*, user: AnyUser) -> list[tuple[OrgUnit, str]]:
    return [(m.unit, m.role) for m in _memberships(user)]


def root_unit() -> OrgUnit | None:
    return OrgUnit.objects.filter(kind=UnitKind.ROOT).first()


def ancestors(*, unit: OrgUnit) -> list[OrgUnit]:
    """Root first, ``unit`` last."""
    ids = [int(x) for x in unit.path.strip("/").split("/") if x]
    by_id = {u.pk: u for u in OrgUnit.objects.filter(pk__in=ids)}
    return [by_id[i] for i in ids if i in by_id]


def ssh_keys_of(*, user: AnyUser) -> QuerySet[SshKey]:
    """The user's own SSH public keys (no one else's are ever listed: not a lead's, not an admin's)."""
    if not user.is_authenticated:
        return SshKey.objects.none()
    return SshKey.objects.filter(user_id=user.pk).order_by("name", "pk")


def access_ssh_key(*, user: AnyUser, pk: int | str) -> SshKey:
    """One of the user's own keys; 404 (the same as a missing one) for anyone else's."""
    try:
        return ssh_keys_of(user=user).get(pk=pk)
    except (SshKey.DoesNotExist, ValueError):
        raise Http404("No such SSH key") from None
