"""The fair-share page and API: every member sees their teams' standing, level by level, and what would change it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.cache import cache
from django.urls import reverse
from django.utils import timezone

from scheduling.models import Allocation, Gpu, Task
from scheduling.states import JobState
from tenants.services import quota_set, token_create_personal
from tests.factories import make_job


@pytest.fixture(autouse=True)
def _fresh_usage_cache():
    cache.clear()  # decayed usage is cached for 30 s in the shared cache (this test run's own Redis db)
    yield
    cache.clear()


def _used(team, user, *, gpus: int, hours: float) -> None:
    """A finished job of ``team`` that held ``gpus`` GPUs for ``hours``, ending now."""
    now = timezone.now()
    job = make_job(team=team, user=user, state=JobState.COMPLETED, gpus_per_replica=gpus)
    held = Allocation.objects.filter(released_at__isnull=True).values("gpu_id")
    chosen = list(Gpu.objects.exclude(pk__in=held).order_by("node__name", "index")[:gpus])
    task = Task.objects.create(job=job, attempt=1, rank=0, node=chosen[0].node, state="EXITED")
    for gpu in chosen:
        Allocation.objects.create(
            gpu=gpu, task=task, job=job, attempt=1, allocated_at=now - timedelta(hours=hours), released_at=now
        )


def test_a_member_sees_their_team_behind_a_lighter_sibling_and_why(client, cast):
    _used(cast.org.team_a, cast.ann, gpus=8, hours=10)  # 80 GPU-h, decayed a little
    _used(cast.org.team_b, cast.ben, gpus=2, hours=5)
    client.force_login(cast.ann)
    body = " ".join(client.get(reverse("fairshare")).content.decode().split())
    assert 'data-team="team-a"' in body and 'data-team="team-b"' not in body  # only my team's section
    assert "Among the teams of Vision: place 2 of 2" in body
    assert "team-a would move ahead of team-b once team-b uses about" in body
    assert "Decay alone does not change this order" in body
    assert "Vision among the units of Research" in body  # the standing goes up the tree


def test_the_api_gives_the_same_standing(client, cast):
    _used(cast.org.team_a, cast.ann, gpus=8, hours=10)
    raw = token_create_personal(user=cast.ann, name="ci", expires_at=None).raw
    data = client.get("/api/v1/fairshare", HTTP_AUTHORIZATION=f"Bearer {raw}").json()
    [team] = data["teams"]
    assert team["team"]["slug"] == "team-a" and data["half_life_days"] == 7.0
    first = team["levels"][0]
    assert (first["parent"]["name"], first["place"], first["of"]) == ("Vision", 2, 2)
    assert [s["unit"]["name"] for s in first["siblings"]] == ["team-b", "team-a"]
    mine = first["siblings"][1]
    assert mine["dominant_type"] == "H100" and 75 < mine["usage_gpu_hours"]["H100"] < 80  # decayed a little
    assert first["what_would_change_it"]


def test_a_higher_weight_puts_a_heavier_team_first(client, cast):
    _used(cast.org.team_a, cast.ann, gpus=8, hours=10)
    _used(cast.org.team_b, cast.ben, gpus=2, hours=10)
    quota_set(actor=None, unit=cast.org.team_a, gpu_type="H100", guaranteed=16, limit=32, weight=10.0)
    client.force_login(cast.ann)
    assert "Among the teams of Vision: place 1 of 2" in " ".join(client.get(reverse("fairshare")).content.decode().split())


def test_another_tenants_team_is_404_on_the_page_and_the_api(client, cast):
    client.force_login(cast.ann)
    assert client.get(reverse("fairshare"), {"team": cast.org.team_c.pk}).status_code == 404
    assert client.get("/api/v1/fairshare", {"team": "team-c"}).status_code == 404
    assert client.get("/api/v1/fairshare", {"team": "no-such-team"}).status_code == 404


def test_an_org_admin_may_ask_for_a_team_of_their_subtree(client, cast):
    client.force_login(cast.oli)
    body = client.get(reverse("fairshare"), {"team": cast.org.team_b.pk}).content.decode()
    assert 'data-team="team-b"' in body


def test_the_page_needs_a_login(client, cast):
    assert client.get(reverse("fairshare")).status_code == 302


def test_the_clusters_cores_and_memory_are_said_with_their_units(client, cast):
    _used(cast.org.team_a, cast.ann, gpus=8, hours=10)
    client.force_login(cast.ann)
    body = " ".join(client.get(reverse("fairshare")).content.decode().split())
    cluster = body.split("the cluster has ", 1)[1].split(")", 1)[0]
    assert " cpu" not in cluster and " memory," not in cluster
    assert "CPU cores" in cluster and "TiB memory" in cluster, cluster
