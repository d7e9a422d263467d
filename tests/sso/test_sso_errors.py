"""Bad SSO configuration and broken callbacks end on the sign-in page with a message, never a 500;
passwords can be switched off while API tokens keep working."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from sso.config import GroupMapError, load_group_map, parse_group_map
from tenants.models import Role
from tenants.services import token_create_personal
from tests.factories import make_org, make_user
from tests.sso.conftest import configure, free_port

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def _messages(response: Any) -> str:
    return " ".join(str(m) for m in response.context["messages"]) if response.context else ""


def test_an_unreachable_issuer_is_a_clear_message_on_the_sign_in_page(client, settings):
    configure(settings, issuer=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    response = client.get("/oidc/authenticate/", follow=True)
    assert response.status_code == 200 and response.redirect_chain[-1][0] == "/login/"
    assert "identity provider at http://127.0.0.1:" in _messages(response) and "cannot be reached" in _messages(response)


def test_an_issuer_that_is_not_an_oidc_provider_is_a_clear_message(client, settings, live_server):
    configure(settings, issuer=live_server.url)  # the portal itself: its /.well-known/… is a 404
    response = client.get("/oidc/authenticate/", follow=True)
    assert response.status_code == 200
    assert "answered HTTP 404" in _messages(response)


def test_the_authorization_request_carries_a_pkce_challenge_and_a_nonce(client, settings, idp):
    configure(settings, issuer=idp.issuer)
    response = client.get("/oidc/authenticate/")
    assert response.status_code == 302 and response["Location"].startswith(f"{idp.issuer}/auth?")
    location = response["Location"]
    assert "code_challenge_method=S256" in location and "code_challenge=" in location and "nonce=" in location


def test_a_callback_with_an_unknown_state_is_a_message_not_an_error(client, settings, idp):
    configure(settings, issuer=idp.issuer)
    client.get("/oidc/authenticate/")  # the session now holds one state
    response = client.get("/oidc/callback/?code=abc&state=forged", follow=True)
    assert response.status_code == 200 and "could not be matched to this browser" in _messages(response)


def test_a_callback_without_a_started_sign_in_is_a_message(client, settings, idp):
    configure(settings, issuer=idp.issuer)
    response = client.get("/oidc/callback/?code=abc&state=xyz", follow=True)
    assert response.status_code == 200 and "please sign in again" in _messages(response)


def test_a_provider_error_is_shown_with_its_description(client, settings, idp):
    configure(settings, issuer=idp.issuer)
    response = client.get("/oidc/callback/?error=access_denied&error_description=End-User+aborted", follow=True)
    assert response.status_code == 200 and "refused by the identity provider: End-User aborted" in _messages(response)


def test_with_sso_off_the_sign_in_page_shows_no_sso_button_and_the_endpoint_says_so(client):
    page = client.get("/login/")
    assert page.status_code == 200 and b"sso-login" not in page.content and b'name="password"' in page.content
    response = client.get("/oidc/authenticate/", follow=True)
    assert "not configured" in _messages(response)


def test_with_local_passwords_off_a_password_is_refused_and_the_admin_form_is_gone(client, settings, idp):
    make_user("ann", password="pw-for-tests-1")
    configure(settings, issuer=idp.issuer, local_login=False)
    page = client.get("/login/")
    assert b'name="password"' not in page.content and b"Continue with Test IdP" in page.content
    refused = client.post("/login/", {"username": "ann", "password": "pw-for-tests-1"})
    assert refused.status_code == 400 and "Passwords are switched off" in _messages(refused)
    assert "_auth_user_id" not in client.session
    admin = client.get("/admin/login/?next=/admin/")
    assert admin.status_code == 302 and admin["Location"].startswith("/login/?next=")


def test_api_tokens_keep_working_with_local_passwords_off(client, settings, idp):
    org = make_org()
    ann = make_user("ann", unit=org.team_a, role=Role.MEMBER)
    raw = token_create_personal(user=ann, name="ci", expires_at=None).raw
    configure(settings, issuer=idp.issuer, local_login=False)
    response = client.get("/api/v1/jobs", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert response.status_code == 200


def test_a_linked_local_staff_account_is_never_taken_over_by_a_provider_account(settings, idp):
    from sso.services import SsoRefused, sso_sign_in

    make_org()
    get_user_model().objects.create_user(username="admin", is_staff=True)
    configure(settings, issuer=idp.issuer)
    with pytest.raises(SsoRefused, match="already exists"):
        sso_sign_in(issuer=idp.issuer, claims={"sub": "evil", "preferred_username": "admin", "groups": ["platform"]})


# --------------------------------------------------------------------------- the group map


def test_group_map_grants_in_json_and_toml_agree(tmp_path):
    toml = tmp_path / "map.toml"
    toml.write_text('"ml-a" = { unit = "team-a" }\n"ml-all" = [{ unit = "team-a" }, { team = "team-b", role = "team_lead" }]\n')
    from_toml = load_group_map(inline="", path=str(toml))
    from_json = load_group_map(
        inline='{"ml-a": {"unit": "team-a"}, "ml-all": [{"unit": "team-a"}, {"unit": "team-b", "role": "team_lead"}]}', path=""
    )
    assert from_toml == from_json
    assert [(g.group, g.unit, g.role) for g in from_json] == [
        ("ml-a", "team-a", "member"), ("ml-all", "team-a", "member"), ("ml-all", "team-b", "team_lead"),
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ('{"g": {"unit": "a", "role": "boss"}}', "role 'boss' is not one of"),
        ('{"g": {"role": "member"}}', "needs the slug of a unit"),
        ('{"g": {"unit": "a", "role": "cluster_admin"}}', "leave out the unit"),
        ('{"g": {"unit": "a", "colour": "red"}}', "unknown key(s) colour"),
        ('["g"]', "must be an object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_bad_group_map_names_the_group_and_what_to_write(raw, says):
    with pytest.raises(GroupMapError) as caught:
        load_group_map(inline=raw, path="")
    assert says in str(caught.value)


def test_parse_keeps_the_strongest_role_per_unit_at_sign_in(settings, idp):
    from sso.services import memberships_from_groups

    org = make_org()
    user = make_user("fay")
    settings.YARD_OIDC_GROUP_MAP = parse_group_map(
        {"a-members": {"unit": "team-a"}, "a-leads": {"unit": "team-a", "role": "team_lead"}}
    )
    assert memberships_from_groups(user=user, groups=["a-members", "a-leads"]) == {org.team_a.pk: Role.TEAM_LEAD}


def _settings_start(**env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("YARD_OIDC") and k != "YARD_LOCAL_LOGIN"}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT, env={**clean, "DJANGO_SETTINGS_MODULE": "portal.settings", **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def test_the_portal_will_not_start_with_an_issuer_and_no_group_map():
    result = _settings_start(YARD_OIDC_ISSUER="https://idp.example.com", YARD_OIDC_CLIENT_ID="yard")
    assert result.returncode != 0 and "maps no group" in result.stderr


def test_the_portal_will_not_start_with_passwords_off_and_no_provider():
    result = _settings_start(YARD_LOCAL_LOGIN="0")
    assert result.returncode != 0 and "nobody could sign in" in result.stderr
