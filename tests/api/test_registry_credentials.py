"""/api/v1/registry-credentials: set, list and delete a team's registry logins; the password is write-only and sealed."""

from typing import Any

import pytest
from django.db import connection

from scheduling.models import RegistryCredential
from tenants.models import AuditEntry
from tests.api.conftest import session_client, token_client

pytestmark = pytest.mark.django_db
URL = "/api/v1/registry-credentials"
SECRET = "nvapi-very-secret-token-1234"


def body(unit: Any, **kw: Any) -> dict[str, Any]:
    return {"unit": unit.slug, "registry": "nvcr.io", "username": "$oauthtoken", "password": SECRET, **kw}


def test_a_team_lead_sets_a_credential_and_no_answer_holds_the_password(cast):
    client = session_client(cast.lead)
    created = client.post(URL, body(cast.org.team_a), format="json")
    assert created.status_code == 201, created.content
    assert SECRET not in created.content.decode()
    out = created.json()
    assert (out["registry"], out["username"], out["unit"]["slug"], out["created_by"]) == (
        "nvcr.io",
        "$oauthtoken",
        cast.org.team_a.slug,
        "lea",
    )
    assert "password" not in out and "password_sealed" not in out
    listed = client.get(URL)
    assert listed.status_code == 200
    assert [c["id"] for c in listed.json()] == [out["id"]]
    assert SECRET not in listed.content.decode()


def test_the_password_is_sealed_at_rest(cast):
    session_client(cast.lead).post(URL, body(cast.org.team_a), format="json")
    with connection.cursor() as cursor:
        cursor.execute("SELECT password_sealed, username, registry FROM scheduling_registrycredential")
        rows = cursor.fetchall()
    assert len(rows) == 1
    assert SECRET not in rows[0][0] and rows[0][1:] == ("$oauthtoken", "nvcr.io")
    assert not [e for e in AuditEntry.objects.all() if SECRET in f"{e.message} {e.data}"]


def test_setting_it_again_replaces_it(cast):
    client = session_client(cast.lead)
    first = client.post(URL, body(cast.org.team_a), format="json").json()
    again = client.post(URL, body(cast.org.team_a, username="robot", password="new-one"), format="json")
    assert again.status_code == 200
    assert again.json()["id"] == first["id"] and again.json()["username"] == "robot"
    assert RegistryCredential.objects.count() == 1


def test_an_org_admin_sets_one_for_a_department(cast):
    created = session_client(cast.admin).post(URL, body(cast.org.dept, registry="Registry.Corp:5000"), format="json")
    assert created.status_code == 201, created.content
    assert created.json()["registry"] == "registry.corp:5000"


def test_a_member_may_not_manage_the_teams_credentials(cast):
    response = token_client(cast.ann_token).post(URL, body(cast.org.team_a), format="json")
    assert response.status_code == 400
    assert response.json()["fields"]["unit"] == ["No such unit, or not one whose registry credentials you may manage"]
    assert SECRET not in response.content.decode()
    assert RegistryCredential.objects.count() == 0


def test_another_tenants_credential_is_not_listed_or_deleted(cast):
    theirs = session_client(cast.admin).post(URL, body(cast.org.team_a), format="json").json()
    bea = token_client(cast.bea_token)
    assert bea.get(URL).json() == []
    assert bea.get(URL, {"unit": cast.org.team_a.slug}).status_code == 400
    assert bea.delete(f"{URL}/{theirs['id']}").status_code == 404
    assert RegistryCredential.objects.filter(pk=theirs["id"]).exists()


def test_a_lead_deletes_the_teams_credential(cast):
    client = session_client(cast.lead)
    made = client.post(URL, body(cast.org.team_a), format="json").json()
    assert client.delete(f"{URL}/{made['id']}").status_code == 204
    assert not RegistryCredential.objects.exists()
    assert client.delete(f"{URL}/{made['id']}").status_code == 404


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"registry": "https://nvcr.io"}, "registry"),
        ({"registry": "bad host"}, "registry"),
        ({"registry": "nvcr.io:99999"}, "registry"),
        ({"username": ""}, "username"),
        ({"password": ""}, "password"),
        ({"password": "x" * 5000}, "password"),
    ],
)
def test_bad_input_is_a_400_naming_the_field_without_the_password(cast, change, field):
    response = session_client(cast.lead).post(URL, body(cast.org.team_a, **change), format="json")
    assert response.status_code == 400, response.content
    assert field in response.json()["fields"]
    assert SECRET not in response.content.decode()
