"""Registry credentials in the Django admin: a superuser lists, adds, changes and deletes them through the
same services as the API (sealed, audited), and no page ever holds the password or its sealed text."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from scheduling.models import RegistryCredential
from scheduling.registry_credentials import credential_for_image
from tenants.models import AuditEntry
from tests.factories import make_org

pytestmark = pytest.mark.django_db
BASE = "/admin/scheduling/registrycredential/"
SECRET = "nvapi-secret-never-shown"


@pytest.fixture
def admin_client(settings) -> Client:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-1")
    client = Client()
    client.force_login(root)
    return client


def test_a_superuser_adds_changes_and_deletes_a_credential_and_never_sees_the_password(admin_client: Client) -> None:
    org = make_org()
    added = admin_client.post(
        f"{BASE}add/", {"unit": org.team_a.pk, "registry": "NVCR.io", "username": "$oauthtoken", "password": SECRET}
    )
    assert added.status_code == 302, added.content.decode()[-2000:]
    credential = RegistryCredential.objects.get()
    assert credential.registry == "nvcr.io" and SECRET not in credential.password_sealed
    assert credential_for_image(team_id=org.team_a.pk, image="nvcr.io/nvidia/pytorch:24.05-py3") == {
        "username": "$oauthtoken",
        "password": SECRET,
    }
    assert AuditEntry.objects.filter(action="registry_credential.create").exists()

    listing = admin_client.get(BASE).content.decode()
    page = admin_client.get(f"{BASE}{credential.pk}/change/").content.decode()
    assert "$oauthtoken" in listing and "nvcr.io" in page
    for text in (listing, page):
        assert SECRET not in text and credential.password_sealed not in text
    assert admin_client.get(f"{BASE}?q={credential.password_sealed[:12]}").context["cl"].result_count == 0

    changed = admin_client.post(f"{BASE}{credential.pk}/change/", {"username": "ci-bot", "password": "rotated"})
    assert changed.status_code == 302
    assert credential_for_image(team_id=org.team_a.pk, image="nvcr.io/x:1") == {"username": "ci-bot", "password": "rotated"}
    assert RegistryCredential.objects.count() == 1
    assert AuditEntry.objects.filter(action="registry_credential.replace").exists()

    without = admin_client.post(f"{BASE}{credential.pk}/change/", {"username": "ci-bot", "password": ""})
    assert without.status_code == 200 and "This field is required" in without.content.decode()

    deleted = admin_client.post(f"{BASE}{credential.pk}/delete/", {"post": "yes"})
    assert deleted.status_code == 302 and not RegistryCredential.objects.exists()
    assert AuditEntry.objects.filter(action="registry_credential.delete").exists()


def test_a_bad_registry_is_said_on_the_form(admin_client: Client) -> None:
    org = make_org()
    answer = admin_client.post(
        f"{BASE}add/", {"unit": org.team_a.pk, "registry": "https://nvcr.io", "username": "u", "password": "p"}
    )
    assert answer.status_code == 200 and not RegistryCredential.objects.exists()
    assert answer.context["adminform"].form.errors["registry"]
