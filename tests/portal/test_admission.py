"""A web worker works on a bounded number of requests at once and sheds the rest fast, heartbeats and
/healthz aside (portal/middleware.py AdmissionMiddleware; gunicorn sets the bound to its threads - 1)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory

from portal.middleware import AdmissionMiddleware


def _middleware(monkeypatch: pytest.MonkeyPatch, limit: str) -> tuple[AdmissionMiddleware, threading.Event, threading.Event]:
    monkeypatch.setenv("YARD_WEB_INFLIGHT", limit)
    entered, release = threading.Event(), threading.Event()

    def slow(request: HttpRequest) -> HttpResponse:
        if request.path == "/api/v1/jobs":
            entered.set()
            assert release.wait(10)
        return HttpResponse("ok")

    return AdmissionMiddleware(slow), entered, release


def _in_thread(call: Callable[[], HttpResponse]) -> tuple[threading.Thread, list[HttpResponse]]:
    out: list[HttpResponse] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


def test_past_the_bound_a_request_is_shed_at_once_with_retry_after_and_a_heartbeat_still_goes_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    middleware, entered, release = _middleware(monkeypatch, "1")
    rf = RequestFactory()
    thread, first = _in_thread(lambda: middleware(rf.get("/api/v1/jobs")))
    assert entered.wait(5)
    shed = middleware(rf.get("/api/v1/jobs"))
    assert shed.status_code == 503 and int(shed["Retry-After"]) >= 1
    assert json.loads(shed.content)["code"] == "overloaded"
    page = middleware(rf.get("/jobs/"))
    assert page.status_code == 503 and b"Busy for a moment" in page.content  # a person gets a page, not JSON
    for always in ("/api/agent/v1/heartbeat", "/healthz"):
        assert middleware(rf.post(always)).status_code == 200
    release.set()
    thread.join(5)
    assert first[0].status_code == 200
    assert middleware(rf.get("/api/v1/jobs")).status_code == 200  # room again
    assert middleware.shed == 2 and middleware.busy == 0


def test_without_a_bound_nothing_is_shed(monkeypatch: pytest.MonkeyPatch) -> None:
    middleware, entered, release = _middleware(monkeypatch, "")
    rf = RequestFactory()
    thread, _ = _in_thread(lambda: middleware(rf.get("/api/v1/jobs")))
    assert entered.wait(5)
    release.set()
    assert middleware(rf.get("/api/v1/jobs")).status_code == 200
    thread.join(5)
    assert middleware.shed == 0


@pytest.fixture
def no_blind_streak() -> Iterator[None]:
    """The web tier's blind streak lives in the cache (this worker's Redis database): one recorded here
    would make a later test's liveness check forgive its nodes' silence, so it is gone before and after."""
    from django.core.cache import cache

    from portal.middleware import BLIND_LATEST_KEY, BLIND_SINCE_KEY

    cache.delete_many([BLIND_SINCE_KEY, BLIND_LATEST_KEY])
    yield
    cache.delete_many([BLIND_SINCE_KEY, BLIND_LATEST_KEY])


def test_an_agents_call_picked_up_past_its_deadline_is_shed_unread_and_recorded_blind(
    monkeypatch: pytest.MonkeyPatch, no_blind_streak: None
) -> None:
    """X-Yard-Deadline: the moment (the portal's clock) past which the agent no longer waits. A heartbeat
    that queued until then is answered "overloaded" at once, with the blind streak it belongs to, and its
    work is not done; one still in time is served."""
    import time

    middleware, _, _ = _middleware(monkeypatch, "")
    rf = RequestFactory()
    late = rf.post("/api/agent/v1/heartbeat", HTTP_X_YARD_DEADLINE=f"{time.time() - 0.5:.3f}")
    answer = middleware(late)
    body = json.loads(answer.content)
    assert answer.status_code == 503 and body["code"] == "overloaded" and body["blind_since"] <= time.time()
    assert middleware.late == 1
    in_time = rf.post("/api/agent/v1/heartbeat", HTTP_X_YARD_DEADLINE=f"{time.time() + 5:.3f}")
    assert middleware(in_time).status_code == 200
    for odd in ("soon", "nan", "inf"):
        assert middleware(rf.post("/api/agent/v1/heartbeat", HTTP_X_YARD_DEADLINE=odd)).status_code == 200
    user_call = rf.get("/api/v1/me", HTTP_X_YARD_DEADLINE=f"{time.time() - 5:.3f}")
    assert middleware(user_call).status_code == 200  # only agents name deadlines
