"""Repeated bad API tokens from one address lock it out (429 with Retry-After), valid tokens included,
until the cool-off has passed; other addresses are not affected."""

from __future__ import annotations

import time

import pytest
from django.conf import settings

from tenants import lockout
from tests.api.conftest import token_client

pytestmark = pytest.mark.django_db


def _me(raw: str, ip: str = "127.0.0.1"):
    return token_client(raw).get("/api/v1/me", REMOTE_ADDR=ip)


def test_thirty_bad_tokens_lock_the_address_out(cast):
    limit = settings.YARD["TOKEN_FAILURE_LIMIT"]
    answers = [_me(f"ym_guess-{i}") for i in range(30)]
    assert [a.status_code for a in answers[:limit]] == [401] * limit
    assert {a.status_code for a in answers[limit:]} == {429}
    body = answers[-1].json()
    assert body["code"] == "locked_out" and "Too many invalid API tokens" in body["message"]
    assert 0 < int(answers[-1]["Retry-After"]) <= settings.YARD["TOKEN_LOCKOUT_S"]
    assert _me(cast.ann_token).status_code == 429  # a guesser learns nothing more, right or wrong


def test_other_addresses_are_not_locked_out(cast):
    for i in range(settings.YARD["TOKEN_FAILURE_LIMIT"] + 1):
        _me(f"ym_guess-{i}", ip="203.0.113.9")
    assert _me(cast.ann_token, ip="198.51.100.4").status_code == 200


def test_after_the_cool_off_a_valid_token_works_again(cast, settings):
    # A short cool-off, waited out for real: the window is a Redis (or database) expiry, not a clock
    # this process could move. Long enough for the guesses and the check to land inside it on a loaded
    # machine (at 1 s, 21 requests on the suite's 4 workers took 1.3 s and the lockout had ended).
    settings.YARD = {**settings.YARD, "TOKEN_LOCKOUT_S": 4.0}
    for i in range(settings.YARD["TOKEN_FAILURE_LIMIT"] + 1):
        _me(f"ym_guess-{i}")
    assert _me(cast.ann_token).status_code == 429
    deadline = time.monotonic() + 20
    while lockout.bad_token_wait("127.0.0.1") is not None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _me(cast.ann_token).status_code == 200


def test_behind_the_proxy_the_address_is_the_one_the_proxy_appended(cast, settings):
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    for i in range(settings.YARD["TOKEN_FAILURE_LIMIT"] + 1):
        # A guesser who forges X-Forwarded-For still gets its real address appended by the proxy.
        token_client(f"ym_guess-{i}").get("/api/v1/me", HTTP_X_FORWARDED_FOR=f"10.9.9.{i}, 203.0.113.9")
    assert token_client(cast.ann_token).get("/api/v1/me", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 429
    assert token_client(cast.ann_token).get("/api/v1/me", HTTP_X_FORWARDED_FOR="198.51.100.4").status_code == 200
