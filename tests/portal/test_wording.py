"""The portal's sentences read right: a time-limit stop says 124 as `yard wait` does, a running job says how
long it has left and when it last checkpointed, a start not today has its day, and a bad token names the page."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.urls import reverse
from django.utils import timezone

from portal.templatetags.yardfmt import when_words
from scheduling.models import JobKind, Tier
from scheduling.states import JobState
from tests.factories import make_job


def _page(client, cast, job, name="job"):
    client.force_login(cast.ann)
    return " ".join(client.get(reverse(name, args=[job.pk])).content.decode().split())


def test_a_time_limit_stop_shows_124_as_yard_wait_does(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, state=JobState.FAILED, stop_reason="TIME_LIMIT", exit_code=-1)
    body = _page(client, cast, job)
    assert '<dd id="exit-code">124 (time limit reached' in body
    assert "-1" not in body.split('id="exit-code"', 1)[1][:80]


def test_a_running_job_says_its_time_left_and_its_last_checkpoint(client, cast):
    now = timezone.now()
    job = make_job(
        team=cast.org.team_a, user=cast.ann, state=JobState.RUNNING, tier=Tier.RESEARCH, started_at=now - timedelta(hours=1),
        time_limit_s=3 * 3600, last_checkpoint_at=now - timedelta(minutes=20),
    )  # fmt: skip
    body = _page(client, cast, job)
    remaining = body.split('<dd id="time-remaining">', 1)[1].split("</dd>", 1)[0]
    assert remaining.startswith(("1 h 59 min", "2 h")) and "the time limit stops it at" in remaining
    checkpoint = body.split('<dd id="last-checkpoint">', 1)[1].split("</dd>", 1)[0]
    assert "20 minutes ago" in checkpoint


def test_a_preemptible_job_without_a_checkpoint_says_so_and_production_shows_none(client, cast):
    started = timezone.now() - timedelta(minutes=5)
    spot = make_job(team=cast.org.team_a, user=cast.ann, state=JobState.RUNNING, tier=Tier.SPOT, started_at=started)
    assert "none yet" in _page(client, cast, spot).split('id="last-checkpoint"', 1)[1][:120]
    prod = make_job(team=cast.org.team_a, user=cast.ann, state=JobState.RUNNING, tier=Tier.PRODUCTION, started_at=started)
    assert 'id="last-checkpoint"' not in _page(client, cast, prod)


def test_a_start_not_today_names_its_day():
    now = datetime(2026, 12, 1, 7, 0, tzinfo=UTC)  # a Tuesday, in the tests' UTC
    assert when_words(datetime(2026, 12, 1, 9, 30, tzinfo=UTC), now) == "09:30"
    assert when_words(datetime(2026, 12, 2, 5, 57, tzinfo=UTC), now) == "tomorrow 05:57"
    assert when_words(datetime(2026, 12, 3, 5, 57, tzinfo=UTC), now) == "Thu 3 Dec 05:57"
    assert when_words(datetime(2027, 1, 5, 5, 57, tzinfo=UTC), now) == "Tue 5 Jan 2027 05:57"


def test_a_queued_notebook_starting_tomorrow_says_tomorrow(client, cast):
    start = timezone.localtime() + timedelta(days=1)
    job = make_job(
        team=cast.org.team_a, user=cast.ann, state=JobState.PENDING, kind=JobKind.NOTEBOOK, estimated_start=start,
        pending_reason="over team team-a quota",
    )  # fmt: skip
    assert f"estimated start tomorrow {start:%H:%M}" in _page(client, cast, job, "notebook")


def test_a_bad_token_names_the_api_tokens_page_and_its_path(client, cast):
    response = client.get("/api/v1/jobs", HTTP_AUTHORIZATION="Bearer ym_not-a-real-token")
    assert response.status_code == 401
    detail = response.json()["message"]
    assert "API tokens page" in detail and "/tokens/" in detail and "profile" not in detail
