"""The notifications pages: the list and its unread count, preferences, webhooks; ownership on every endpoint."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from notifications.kinds import Channel, Kind
from notifications.models import Notification, Preference, Webhook
from notifications.services import notifications_collect, webhook_create
from scheduling.services import job_transition
from scheduling.states import JobState
from tests.factories import make_job
from tests.portal.conftest import Cast

pytestmark = pytest.mark.django_db


def _failed_job_for(user: Any, team: Any) -> None:
    job = make_job(team=team, user=user, state=JobState.RUNNING, name="bert")
    job_transition(job=job, to=JobState.FAILED, reason="a rank failed (exit 1)", actor_label="scheduler", exit_code=1)
    notifications_collect(now=timezone.now())


def test_the_nav_shows_the_unread_count_and_the_list_marks_them_read(client, cast: Cast):
    notifications_collect(now=timezone.now())
    Notification.objects.update(read_at=timezone.now())  # the cast's own quota.create rows
    _failed_job_for(cast.ann, cast.org.team_a)
    client.force_login(cast.ann)
    dashboard = client.get("/")
    assert b'id="nav-notifications">Notifications <span class="badge FAILED" title="unread">1</span>' in dashboard.content
    page = client.get("/notifications/")
    assert page.status_code == 200 and b"bert failed (exit code 1)" in page.content and b">new<" in page.content
    assert not Notification.objects.filter(user=cast.ann, read_at__isnull=True).exists()
    assert b'title="unread"' not in client.get("/").content


def test_nobody_sees_anothers_notifications(client, cast: Cast):
    _failed_job_for(cast.ann, cast.org.team_a)
    client.force_login(cast.lea)  # ann's team lead
    assert b"bert failed" not in client.get("/notifications/").content


def test_preferences_form_turns_a_channel_on_and_off(client, cast: Cast, smtp):
    client.force_login(cast.ann)
    page = client.get("/notifications/settings/")
    assert page.status_code == 200 and b"E-mail" in page.content
    response = client.post("/notifications/settings/", {f"portal__{Kind.JOB_STARTED}": "on", f"email__{Kind.JOB_STARTED}": "on"})
    assert response.status_code == 302
    got = {(p.kind, p.channel): p.enabled for p in Preference.objects.filter(user=cast.ann)}
    assert got[(Kind.JOB_STARTED, Channel.EMAIL)] is True and got[(Kind.JOB_FAILED, Channel.EMAIL)] is False
    assert got[(Kind.JOB_FAILED, Channel.PORTAL)] is False  # unticked boxes are choices too


def test_without_smtp_the_preferences_offer_only_the_portal(client, cast: Cast):
    client.force_login(cast.ann)
    page = client.get("/notifications/settings/")
    assert b"E-mail is not configured" in page.content and f"email__{Kind.JOB_FAILED}".encode() not in page.content


def test_a_new_webhooks_secret_is_shown_once(client, cast: Cast, hooks):
    client.force_login(cast.ann)
    response = client.post(
        "/notifications/webhooks/", {"name": "mine", "url": hooks.url, "kinds": [Kind.JOB_FAILED, Kind.JOB_COMPLETED]}
    )
    hook = Webhook.objects.get(user=cast.ann)
    assert response.status_code == 200 and hook.secret.encode() in response.content
    assert hook.kinds == [Kind.JOB_COMPLETED, Kind.JOB_FAILED] and hook.team is None
    assert hook.secret.encode() not in client.get("/notifications/webhooks/").content


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"name": "x", "url": "ftp://example.com/x", "kinds": [Kind.JOB_FAILED]}, b"use an http:// or https:// URL"),
        ({"name": "x", "url": "http://127.0.0.1:9/x", "kinds": [Kind.JOB_FAILED]}, b"webhooks may not call"),
        ({"name": "x", "url": "https://hooks.example.com/x", "kinds": []}, b"This field is required"),
        ({"name": "x", "url": "https://hooks.example.com/x", "kinds": ["bogus"]}, b"Select a valid choice"),
    ],
)
def test_bad_webhook_input_is_a_400_that_says_what_to_change(client, cast: Cast, settings, data, says):
    settings.YARD_NOTIFY = {**settings.YARD_NOTIFY, "WEBHOOK_DENY_NETWORKS": ["127.0.0.0/8"]}
    client.force_login(cast.ann)
    response = client.post("/notifications/webhooks/", data)
    assert response.status_code == 400 and says in response.content
    assert not Webhook.objects.exists()


def test_only_a_lead_can_add_a_teams_webhook(client, cast: Cast, hooks):
    client.force_login(cast.ann)  # a member of team-a, not its lead
    refused = client.post(
        "/notifications/webhooks/", {"name": "t", "url": hooks.url, "team": cast.org.team_a.pk, "kinds": [Kind.JOB_FAILED]}
    )
    assert refused.status_code == 400 and b"Select a valid choice" in refused.content
    client.force_login(cast.lea)
    made = client.post(
        "/notifications/webhooks/", {"name": "t", "url": hooks.url, "team": cast.org.team_a.pk, "kinds": [Kind.JOB_FAILED]}
    )
    assert made.status_code == 200 and Webhook.objects.get().team == cast.org.team_a


def test_another_users_webhook_is_a_404_on_every_action(client, cast: Cast, hooks):
    hook = webhook_create(actor=cast.ann, name="mine", url=hooks.url, kinds=[Kind.JOB_FAILED], team=None).webhook
    client.force_login(cast.ben)
    for action in ("", "enable/", "delete/"):
        assert (
            client.post(f"/notifications/webhooks/{hook.pk}/{action}", {f"hook{hook.pk}-kinds": [Kind.JOB_FAILED]}).status_code
            == 404
        )
    assert Webhook.objects.filter(pk=hook.pk).exists()
    assert client.get(f"/notifications/webhooks/{hook.pk}/delete/").status_code == 405


def test_a_lead_edits_the_events_of_the_teams_webhook(client, cast: Cast, hooks):
    hook = webhook_create(actor=cast.lea, name="t", url=hooks.url, kinds=[Kind.JOB_FAILED], team=cast.org.team_a).webhook
    client.force_login(cast.oli)  # org admin of Research: leads every team under it
    response = client.post(f"/notifications/webhooks/{hook.pk}/", {f"hook{hook.pk}-kinds": [Kind.QUOTA_CHANGED]})
    assert response.status_code == 302
    hook.refresh_from_db()
    assert hook.kinds == [Kind.QUOTA_CHANGED]
    client.post(f"/notifications/webhooks/{hook.pk}/delete/")
    assert not Webhook.objects.exists()


def test_pages_need_a_sign_in(client):
    for url in ("/notifications/", "/notifications/settings/", "/notifications/webhooks/"):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
