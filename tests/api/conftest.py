"""A fixed cast for the API tests: two tenants, a person and a CI token on each side."""

from dataclasses import dataclass
from typing import Any

import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from tenants.models import Role
from tenants.services import token_create_personal, token_create_service
from tests.factories import make_cluster, make_org, make_user


@dataclass
class Cast:
    org: Any
    ann: Any  # member of team_a
    lead: Any  # team lead of team_a
    amy: Any  # another member of team_a
    bea: Any  # member of team_c (tenant B)
    admin: Any  # org admin of the Research business unit (team_a and team_b)
    ann_token: str
    ci_token: str  # team_a's service account
    bea_token: str


@pytest.fixture(autouse=True)
def _fresh_cache_and_roomy_throttle(settings):
    cache.clear()  # throttle history and the cycle's debounce key live in the (test) Redis db
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "100000/minute"}}


@pytest.fixture
def cast(db):
    org = make_org()
    ann = make_user("ann", unit=org.team_a)
    bea = make_user("bea", unit=org.team_c)
    return Cast(
        org=org,
        ann=ann,
        lead=make_user("lea", unit=org.team_a, role=Role.TEAM_LEAD),
        amy=make_user("amy", unit=org.team_a),
        bea=bea,
        admin=make_user("rita", unit=org.bu, role=Role.ORG_ADMIN),
        ann_token=token_create_personal(user=ann, name="laptop", expires_at=None).raw,
        ci_token=token_create_service(actor=None, team=org.team_a, name="ci", expires_at=None).raw,
        bea_token=token_create_personal(user=bea, name="laptop", expires_at=None).raw,
    )


@pytest.fixture
def nodes(db):
    return make_cluster(nodes=8, leaves_per_spine=2)


def token_client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client


def session_client(user: Any) -> APIClient:
    client = APIClient(enforce_csrf_checks=False)
    client.force_login(user)
    return client


def job_body(team: Any, **kw: Any) -> dict[str, Any]:
    return {"name": "train", "team": team.slug, "replicas": 2, "gpus_per_replica": 8, "command": "python train.py", **kw}
