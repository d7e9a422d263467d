"""Single sign-on end to end in Debian's Chromium against a real OIDC provider on loopback.

The provider (oidc-provider, tests/sso/idp/) requires PKCE of every client, so each successful
sign-in here also proves that the portal sent a code challenge and its verifier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from sso.models import OidcIdentity
from tenants.models import AuditEntry, Membership, Role
from tests.factories import make_org
from tests.sso.conftest import IdP, configure

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"Debian's chromium is not installed at {CHROMIUM}"),
]


@pytest.fixture
def org(transactional_db: Any) -> Any:
    return make_org()


def _sso_sign_in(page: Any, base_url: str, login: str, *, fresh: bool = True) -> None:
    page.goto(f"{base_url}/login/")
    page.get_by_role("link", name="Continue with Test IdP").click()
    if fresh:  # the provider's own sign-in form (its devInteractions login page)
        page.locator("input[name=login]").fill(login)
        page.locator("input[name=password]").fill("anything")
        page.get_by_role("button", name="Sign-in").click()
    page.wait_for_url(f"{base_url}/**")


def _roles(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("unit__slug", "role"))


def test_first_sign_in_creates_the_user_with_the_roles_of_their_groups(page, live_server, idp: IdP, org, settings):
    configure(settings, issuer=idp.issuer)
    idp.set_accounts(
        {"alice": {"email": "alice@example.com", "given_name": "Alice", "groups": ["ml-team-a", "ml-leads-b", "unrelated"]}}
    )
    _sso_sign_in(page, live_server.url, "alice")
    assert page.url == f"{live_server.url}/", page.content()[:2000]
    assert page.locator(".logout").inner_text().startswith("alice")
    user = get_user_model().objects.get(username="alice")
    assert user.email == "alice@example.com" and user.first_name == "Alice" and not user.has_usable_password()
    assert _roles("alice") == {"team-a": Role.MEMBER, "team-b": Role.TEAM_LEAD}
    identity = OidcIdentity.objects.get(user=user)
    assert identity.issuer == idp.issuer and identity.subject == "alice"
    assert AuditEntry.objects.filter(action="membership.set", message__startswith="alice is Team lead of team-b").exists()


def test_leaving_a_group_at_the_provider_removes_that_role_at_the_next_sign_in(page, live_server, idp: IdP, org, settings):
    configure(settings, issuer=idp.issuer)
    idp.set_accounts({"bruno": {"groups": ["ml-team-a", "ml-leads-b"]}})
    _sso_sign_in(page, live_server.url, "bruno")
    assert _roles("bruno") == {"team-a": Role.MEMBER, "team-b": Role.TEAM_LEAD}
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{live_server.url}/login/")

    idp.set_accounts({"bruno": {"groups": ["ml-team-a", "platform"]}})  # left the leads of team-b, joined platform
    _sso_sign_in(page, live_server.url, "bruno", fresh=False)  # still signed in at the provider
    assert page.url == f"{live_server.url}/"
    assert _roles("bruno") == {"team-a": Role.MEMBER, "cluster": Role.CLUSTER_ADMIN}
    assert AuditEntry.objects.filter(action="membership.remove", unit=org.team_b, actor_label="single sign-on").exists()


def test_a_user_who_left_every_mapped_group_is_told_on_the_sign_in_page_and_loses_the_roles(
    page, live_server, idp: IdP, org, settings
):
    configure(settings, issuer=idp.issuer)
    idp.set_accounts({"carla": {"groups": ["ml-team-a"]}})
    _sso_sign_in(page, live_server.url, "carla")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(f"{live_server.url}/login/")

    idp.set_accounts({"carla": {"groups": ["marketing"]}})
    _sso_sign_in(page, live_server.url, "carla", fresh=False)
    assert page.url.startswith(f"{live_server.url}/login/")
    text = page.locator(".messages").inner_text()
    assert "none of the groups that give access to a team" in text and "marketing" in text
    assert page.locator(".logout").count() == 0  # not signed in
    assert _roles("carla") == {}


def test_a_wrong_client_secret_is_a_clear_message_on_the_sign_in_page(page, live_server, idp: IdP, org, settings):
    configure(settings, issuer=idp.issuer, secret="not-the-secret")
    idp.set_accounts({"dora": {"groups": ["ml-team-a"]}})
    _sso_sign_in(page, live_server.url, "dora")
    assert page.url.startswith(f"{live_server.url}/login/")
    assert "refused Yardmaster's client credentials" in page.locator(".messages").inner_text()
    assert not get_user_model().objects.filter(username="dora").exists()


def test_with_local_passwords_off_the_sign_in_page_offers_only_single_sign_on(page, live_server, idp: IdP, org, settings):
    configure(settings, issuer=idp.issuer, local_login=False)
    idp.set_accounts({"emil": {"groups": ["research-admins"]}})
    page.goto(f"{live_server.url}/login/")
    assert page.locator("input[name=password]").count() == 0
    _sso_sign_in(page, live_server.url, "emil")
    assert page.url == f"{live_server.url}/"
    assert _roles("emil") == {"research": Role.ORG_ADMIN}
