from datetime import timedelta

import pytest
from django.utils import timezone

from tenants.models import ApiToken, hash_token
from tenants.services import token_authenticate, token_create_personal, token_create_service, token_revoke
from tests.factories import make_org, make_user

pytestmark = pytest.mark.django_db


def test_personal_token_is_stored_hashed_and_shown_once():
    user = make_user("ann")
    issued = token_create_personal(user=user, name="laptop", expires_at=None)
    stored = ApiToken.objects.get(pk=issued.token.pk)
    assert issued.raw.startswith("ym_")
    assert stored.token_hash == hash_token(issued.raw)
    assert issued.raw not in {getattr(stored, f.attname) for f in ApiToken._meta.concrete_fields}
    assert token_authenticate(raw=issued.raw) == stored


def test_expired_token_is_refused():
    user = make_user("ann")
    issued = token_create_personal(user=user, name="ci", expires_at=timezone.now() + timedelta(seconds=30))
    ApiToken.objects.filter(pk=issued.token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert token_authenticate(raw=issued.raw) is None


def test_revoked_token_is_refused():
    user = make_user("ann")
    issued = token_create_personal(user=user, name="ci", expires_at=None)
    token_revoke(actor=user, token=issued.token)
    assert token_authenticate(raw=issued.raw) is None


def test_unknown_token_is_refused():
    assert token_authenticate(raw="ym_not-a-real-token") is None


def test_service_token_acts_as_a_member_of_its_team_only():
    org = make_org()
    issued = token_create_service(actor=None, team=org.team_a, name="gitlab", expires_at=None)
    user = issued.token.user
    assert list(user.memberships.values_list("unit__name", flat=True)) == ["team-a"]
    assert token_authenticate(raw=issued.raw).team == org.team_a
