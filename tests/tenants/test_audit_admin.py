"""The audit log is append-only in the Django admin too: a superuser can read entries, never add, edit or
delete them; an enrolment token made in the admin is shown once and kept hashed."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from scheduling.models import EnrolmentToken
from tenants.models import AuditEntry
from tenants.services import audit

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(settings) -> Client:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests-1")
    client = Client()
    client.force_login(root)
    return client


def test_a_superuser_reads_the_audit_log_but_cannot_change_it(admin_client: Client) -> None:
    entry = audit(actor=None, action="quota.update", obj=EnrolmentToken(pk=1), message="team-a H100: 16 -> 20")
    base = "/admin/tenants/auditentry/"
    assert admin_client.get(base).status_code == 200
    assert admin_client.get(f"{base}{entry.pk}/change/").status_code == 200  # a read-only view
    assert admin_client.post(f"{base}{entry.pk}/change/", {"message": "nothing happened"}).status_code == 403
    assert admin_client.post(f"{base}{entry.pk}/delete/", {"post": "yes"}).status_code == 403
    assert admin_client.get(f"{base}add/").status_code == 403
    bulk = admin_client.post(base, {"action": "delete_selected", "_selected_action": [entry.pk], "post": "yes"})
    assert bulk.status_code in (200, 302)
    assert AuditEntry.objects.get(pk=entry.pk).message == "team-a H100: 16 -> 20"


def test_an_enrolment_token_made_in_the_admin_is_shown_once_and_kept_hashed(admin_client: Client) -> None:
    answer = admin_client.post(
        "/admin/scheduling/enrolmenttoken/add/", {"name": "rack-3", "max_uses": 4, "requires_approval": "on"}, follow=True
    )
    assert answer.status_code == 200
    shown = next(str(m) for m in answer.context["messages"] if "shown only now" in str(m))
    raw = shown.rsplit(" ", 1)[1]
    token = EnrolmentToken.objects.get(name="rack-3")
    assert raw.startswith("yen_") and raw not in token.token_hash and (token.max_uses, token.requires_approval) == (4, True)
    assert AuditEntry.objects.filter(action="enrolment.create", object_id=str(token.pk)).exists()
