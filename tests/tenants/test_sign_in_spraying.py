"""Password spraying: one wrong password for each of 40 usernames from one address, sent by 16 parallel
clients through the real sign-in form, gets exactly YARD_SIGN_IN_ADDRESS_LIMIT ordinary refusals and a
429 for every attempt after, with a message that says it is the address; a person from another address
still signs in, and once the window has passed so does one from the sprayed address."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from tenants import counters
from tenants.models import RateCounter
from tests.factories import make_user

pytestmark = pytest.mark.django_db(transaction=True)
PASSWORD = "pw-for-tests-1"
SPRAYER, ELSEWHERE = "203.0.113.9", "198.51.100.4"
CLIENTS, USERNAMES, LIMIT = 16, 40, 20


@pytest.fixture(autouse=True)
def _fresh_counts(settings: Any) -> None:
    from django.core.cache import cache

    cache.clear()
    settings.YARD = {**settings.YARD, "SIGN_IN_ADDRESS_LIMIT": LIMIT, "SIGN_IN_ADDRESS_WINDOW_S": 900.0}


def _spray(address: str) -> list[Any]:
    usernames = [f"user{i}" for i in range(USERNAMES)]
    start = threading.Barrier(CLIENTS)
    answers: list[Any] = []
    lock = threading.Lock()

    def client(mine: list[str]) -> None:
        try:
            browser = Client(REMOTE_ADDR=address)
            start.wait(timeout=30)
            for username in mine:
                answer = browser.post("/login/", {"username": username, "password": "Winter2026!"})
                with lock:
                    answers.append(answer)
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(usernames[i::CLIENTS],)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == USERNAMES
    return answers


def _check(answers: list[Any]) -> None:
    assert Counter(a.status_code for a in answers) == {200: LIMIT, 429: USERNAMES - LIMIT}
    for refused in (a for a in answers if a.status_code == 429):
        assert "Too many failed sign-ins from your address, across accounts" in refused.content.decode()
        assert 0 < int(refused["Retry-After"]) <= 900


def test_spraying_many_usernames_from_one_address_is_stopped_at_the_limit() -> None:
    make_user("ann")
    _check(_spray(SPRAYER))
    # The right password from the sprayed address is refused too while the window lasts ...
    assert Client(REMOTE_ADDR=SPRAYER).post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 429
    # ... and a person elsewhere is not affected.
    owner = Client(REMOTE_ADDR=ELSEWHERE)
    assert owner.post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 302
    assert owner.session["_auth_user_id"]


def test_the_address_limit_is_cleared_by_time(monkeypatch) -> None:
    make_user("ann")
    monkeypatch.setattr(counters, "_redis", lambda: None)  # counted in the database: its window is a row
    _check(_spray(SPRAYER))
    RateCounter.objects.update(expires_at=0.0)  # the window has passed
    assert Client(REMOTE_ADDR=SPRAYER).post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 302


def test_successful_sign_ins_do_not_count_towards_the_address_limit() -> None:
    make_user("ann")
    for _ in range(LIMIT + 5):
        browser = Client(REMOTE_ADDR=SPRAYER)
        assert browser.post("/login/", {"username": "ann", "password": PASSWORD}).status_code == 302
    assert counters.peek(f"sign-in-failed:{SPRAYER}").count == 0


def test_the_api_answer_for_a_sprayed_address_is_json() -> None:
    _spray(SPRAYER)
    answer = Client(REMOTE_ADDR=SPRAYER).post("/login/", {"username": "x", "password": "y"}, HTTP_ACCEPT="application/json")
    assert answer.status_code == 429 and answer.json()["code"] == "locked_out"
