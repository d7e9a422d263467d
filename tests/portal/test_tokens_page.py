"""The API tokens page: a token is shown once, stored hashed, works on the API, and is revocable by its owner only."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from rest_framework.test import APIClient

from tenants.models import ApiToken, Role, TokenKind, hash_token
from tests.factories import make_org, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def people():
    org = make_org()
    return org, make_user("ann", unit=org.team_a), make_user("lee", unit=org.team_a, role=Role.TEAM_LEAD)


def _raw(body: str) -> str:
    start = body.index('id="new-token"')
    return body[body.index(">", start) + 1 : body.index("</code>", start)]


def test_a_personal_token_is_shown_once_stored_hashed_and_works_on_the_api(client, people):
    _, ann, _ = people
    client.force_login(ann)
    body = client.post("/tokens/", {"name": "laptop", "expires_in_days": 30}).content.decode()
    raw = _raw(body)
    token = ApiToken.objects.get(user=ann, kind=TokenKind.PERSONAL)
    assert token.token_hash == hash_token(raw) and raw.startswith(token.prefix)
    assert raw not in client.get("/tokens/").content.decode()  # never shown again
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.get("/api/v1/me").json()["username"] == "ann"


def test_a_team_lead_makes_a_service_token_that_acts_for_the_team(client, people):
    org, _, lee = people
    client.force_login(lee)
    raw = _raw(client.post("/tokens/", {"name": "gitlab", "team": org.team_a.pk, "expires_in_days": 90}).content.decode())
    token = ApiToken.objects.get(token_hash=hash_token(raw))
    assert token.kind == TokenKind.SERVICE and token.team == org.team_a and token.user != lee


def test_a_member_cannot_make_a_service_token_for_the_team(client, people):
    org, ann, _ = people
    client.force_login(ann)
    response = client.post("/tokens/", {"name": "gitlab", "team": org.team_a.pk, "expires_in_days": 90})
    assert response.status_code == 400
    assert "Select a valid choice" in response.content.decode()
    assert not ApiToken.objects.exists()


def test_expiry_beyond_a_year_is_refused_with_the_limit(client, people):
    _, ann, _ = people
    client.force_login(ann)
    response = client.post("/tokens/", {"name": "forever", "expires_in_days": 5000})
    assert response.status_code == 400 and "less than or equal to 365" in response.content.decode()


def test_revoking_someone_elses_token_is_a_404_and_changes_nothing(client, people):
    _, ann, lee = people
    client.force_login(ann)
    client.post("/tokens/", {"name": "laptop", "expires_in_days": 30})
    token = ApiToken.objects.get(user=ann)
    client.force_login(lee)
    assert client.post(f"/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None
    client.force_login(ann)
    client.post(f"/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


def test_create_token_command_prints_a_working_service_token(people):
    org, _, _ = people
    out = StringIO()
    call_command("create_token", team=org.team_a.slug, name="ci", days=7, stdout=out)
    raw = out.getvalue().strip()
    assert ApiToken.objects.get(token_hash=hash_token(raw)).team == org.team_a


def test_create_token_command_names_an_unknown_user():
    with pytest.raises(CommandError, match="no user named 'nobody'"):
        call_command("create_token", user="nobody", name="x")
