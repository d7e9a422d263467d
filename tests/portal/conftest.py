"""A fixed cast for the portal's view tests: one user per role, two tenants, a small cluster."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tenants.models import Role
from tests.factories import Org, make_cluster, make_org, make_user

PASSWORD = "pw-for-tests-1"
CONTEXT_PROCESSOR = "portal.views.context.yard"


@pytest.fixture(autouse=True)
def _yard_context_processor(settings: Any) -> None:
    """The portal's context processor (teams and roles on every page), until settings.py lists it."""
    options = settings.TEMPLATES[0]["OPTIONS"]
    if CONTEXT_PROCESSOR not in options["context_processors"]:
        settings.TEMPLATES = [
            {
                **settings.TEMPLATES[0],
                "OPTIONS": {**options, "context_processors": [*options["context_processors"], CONTEXT_PROCESSOR]},
            }
        ]


@pytest.fixture(autouse=True)
def _fast_password_hashing(settings: Any) -> None:
    # Six users a test: PBKDF2's deliberate slowness would dominate the run.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass
class Cast:
    org: Org
    ann: Any  # member of team-a
    ben: Any  # member of team-b (same department)
    lea: Any  # team lead of team-a
    oli: Any  # org admin of Research (team-a, team-b)
    cat: Any  # cluster admin
    zed: Any  # member of team-c, another business unit


@pytest.fixture
def cast(db: Any) -> Cast:
    org = make_org()
    make_cluster(nodes=4)
    return Cast(
        org=org,
        ann=make_user("ann", unit=org.team_a),
        ben=make_user("ben", unit=org.team_b),
        lea=make_user("lea", unit=org.team_a, role=Role.TEAM_LEAD),
        oli=make_user("oli", unit=org.bu, role=Role.ORG_ADMIN),
        cat=make_user("cat", unit=org.root, role=Role.CLUSTER_ADMIN),
        zed=make_user("zed", unit=org.team_c),
    )
