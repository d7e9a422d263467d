"""Sign-in throttling (django-axes): 30 wrong passwords lock the account out from that address, with a
clear message and a 429; the right password is refused too until the cool-off has passed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client
from django.utils import timezone

from tests.factories import make_user

pytestmark = pytest.mark.django_db
PASSWORD = "pw-for-tests-1"


def _sign_in(client: Client, password: str, username: str = "ann", **extra: str):
    return client.post("/login/", {"username": username, "password": password}, **extra)


def test_thirty_wrong_passwords_lock_the_account_out_with_a_message():
    make_user("ann")
    client = Client()
    answers = [_sign_in(client, f"guess-{i}") for i in range(30)]
    assert [a.status_code for a in answers[: settings.AXES_FAILURE_LIMIT - 1]] == [200] * (settings.AXES_FAILURE_LIMIT - 1)
    assert {a.status_code for a in answers[settings.AXES_FAILURE_LIMIT :]} == {429}
    locked = answers[-1]
    assert "Too many failed sign-ins" in locked.content.decode() and int(locked["Retry-After"]) > 0
    right = _sign_in(client, PASSWORD)
    assert right.status_code == 429  # not let in at once after a run of guesses
    assert "_auth_user_id" not in client.session


def test_after_the_cool_off_the_right_password_works():
    make_user("ann")
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT + 2):
        _sign_in(client, f"guess-{i}")
    assert _sign_in(client, PASSWORD).status_code == 429
    # The cool-off passes (counted from the last attempt).
    AccessAttempt.objects.update(attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(seconds=1))
    answer = _sign_in(client, PASSWORD)
    assert answer.status_code == 302 and client.session["_auth_user_id"]


def test_a_lockout_is_per_address_so_nobody_can_lock_another_out_from_elsewhere():
    make_user("ann")
    attacker = Client(REMOTE_ADDR="203.0.113.9")
    for i in range(settings.AXES_FAILURE_LIMIT + 1):
        attacker.post("/login/", {"username": "ann", "password": f"guess-{i}"})
    assert attacker.post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 429
    owner = Client(REMOTE_ADDR="198.51.100.4")
    assert owner.post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 302


def test_a_success_resets_the_count():
    make_user("ann")
    client = Client()
    for i in range(settings.AXES_FAILURE_LIMIT - 1):
        _sign_in(client, f"guess-{i}")
    assert _sign_in(client, PASSWORD).status_code == 302
    client.post("/logout/")
    assert _sign_in(client, "one-more-typo").status_code == 200
    assert _sign_in(client, PASSWORD).status_code == 302
