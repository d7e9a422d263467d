"""team_submittable and may_submit_to, which answer from a user's memberships, agree with the
teams_submittable queryset they stand in for (every role, slugs and ids, other tenants' teams)."""

import pytest
from django.contrib.auth.models import AnonymousUser
from django.db.models import Q

from tenants.models import OrgUnit, Role
from tenants.selectors import may_submit_to, team_submittable, teams_submittable
from tenants.services import membership_set
from tests.factories import make_org, make_user

pytestmark = pytest.mark.django_db


def _by_query(user, ref: str):
    lookup = Q(slug=ref) | Q(pk=int(ref)) if ref.isdigit() and len(ref) < 19 else Q(slug=ref)
    return teams_submittable(user=user).filter(lookup).first()


def _fresh(user):
    # a new user object each time: the memberships are cached per object (per request)
    return type(user).objects.get(pk=user.pk)


def test_the_memberships_answer_is_the_querysets_for_every_role_and_ref():
    org = make_org()
    users = [
        make_user("member", unit=org.team_a),
        make_user("lead", unit=org.team_b, role=Role.TEAM_LEAD),
        make_user("orgadmin", unit=org.bu, role=Role.ORG_ADMIN),
        make_user("deptadmin", unit=org.dept, role=Role.ORG_ADMIN),
        make_user("clusteradmin", unit=org.root, role=Role.CLUSTER_ADMIN),
        make_user("nobody"),
    ]
    two_teams = make_user("two_teams", unit=org.team_a)
    membership_set(actor=None, user=two_teams, unit=org.team_c, role=Role.MEMBER)
    users.append(two_teams)
    refs = [u.slug for u in OrgUnit.objects.all()] + [str(u.pk) for u in OrgUnit.objects.all()] + ["nope", "999999"]
    checked = 0
    for user in users:
        for ref in refs:
            assert team_submittable(user=_fresh(user), ref=ref) == _by_query(_fresh(user), ref), (user.username, ref)
        for unit in OrgUnit.objects.all():
            allowed = teams_submittable(user=_fresh(user)).filter(pk=unit.pk).exists()
            assert may_submit_to(user=_fresh(user), team=unit) is allowed, (user.username, unit.slug)
            checked += allowed
    assert checked > 0  # some teams were allowed, so the check could fail either way


def test_nobody_signed_in_submits_nowhere():
    org = make_org()
    assert team_submittable(user=AnonymousUser(), ref=org.team_a.slug) is None
    assert may_submit_to(user=AnonymousUser(), team=org.team_a) is False
