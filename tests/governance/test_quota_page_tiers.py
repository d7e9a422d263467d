"""The quota page shows how each team's guarantee is held: claimed in tier order, Tier 1 first."""

from __future__ import annotations

import re

import pytest
from django.core.cache import cache
from django.urls import reverse

from scheduling.cycle import run_cycle_once
from scheduling.models import Job
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState
from tenants.models import Role
from tests.factories import make_cluster, make_org, make_user

pytestmark = pytest.mark.django_db


def _tiers(body: str, unit_id: int) -> str | None:
    cell = re.search(rf'id="q-{unit_id}-H100">(.*?)</td>', body, re.S)
    assert cell is not None
    found = re.search(r'data-tiers="([0-9,]+)"', cell.group(1))
    return found.group(1) if found else None


@pytest.fixture
def held(db):
    """team-a (16 guaranteed) runs 8 GPUs of each tier; its spot job was placed first."""
    cache.clear()
    org = make_org()
    make_cluster(nodes=4)  # 32 H100
    ann = make_user("ann", unit=org.team_a)
    for tier in (3, 2, 1):
        job_submit(user=ann, spec=JobSpec(name=f"t{tier}", team=org.team_a, command="true", tier=tier, gpus_per_replica=8))
        run_cycle_once()
    assert Job.objects.filter(state=JobState.STARTING).count() == 3
    return org


def test_a_teams_guarantee_is_shown_held_by_its_tier_1_then_tier_2_work_and_its_spot_work_as_borrowed(client, held):
    client.force_login(make_user("oli", unit=held.bu, role=Role.ORG_ADMIN))
    body = client.get(reverse("quotas")).content.decode()
    assert _tiers(body, held.team_a.pk) == "8,8,0,8"
    assert "guarantee held by Tier 1 8 · Tier 2 8 · Tier 3 0; borrowed 8" in body
    assert _tiers(body, held.team_b.pk) is None  # holds nothing: nothing to show
    assert _tiers(body, held.dept.pk) is None  # only teams hold work


def test_a_member_sees_the_same_read_only(client, held):
    client.force_login(make_user("amy", unit=held.team_a))
    body = client.get(reverse("quotas")).content.decode()
    assert _tiers(body, held.team_a.pk) == "8,8,0,8"


def test_an_edit_of_the_guarantee_shows_the_new_split_in_the_swapped_cell(client, held):
    client.force_login(make_user("oli", unit=held.bu, role=Role.ORG_ADMIN))
    url = reverse("quota-edit", args=[held.team_a.pk, "H100"])
    response = client.post(url, {"guaranteed": 24, "limit": 32, "weight": 1}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert 'data-tiers="8,8,8,0"' in response.content.decode()
