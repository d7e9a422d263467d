"""A month of the demo's history for the what-if tests: seed_demo's org, users and fleet, the fleet cut to
12 H100 nodes (and its 8 A100) so that the month is contended, then demo_history's month of jobs on it,
ending at a fixed moment (the generator's arrivals depend on the weekday: a fixed end makes the month, and
the replay's answer, the same whatever day the tests run)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from scheduling.management.commands.demo_history import seed_history
from scheduling.models import Node
from tenants.models import OrgUnit

END = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
H100_NODES = 12


@dataclass
class Month:
    start: datetime
    end: datetime
    admin: Any  # cluster admin
    rita: Any  # org admin of Research
    alice: Any  # member of pretraining

    @staticmethod
    def unit(name: str) -> OrgUnit:
        return OrgUnit.objects.get(name=name)


def seed_month() -> Month:
    with open("/dev/null", "w") as quiet:
        call_command("seed_demo", "--no-history", stdout=quiet)
    h100 = list(Node.objects.filter(gpu_type="H100").order_by("name").values_list("pk", flat=True))
    Node.objects.filter(pk__in=h100[H100_NODES:]).delete()
    seed_history(now=END)
    users = get_user_model().objects
    return Month(
        END - timedelta(days=31), END, users.get(username="admin"), users.get(username="rita"), users.get(username="alice")
    )


@pytest.fixture
def month(db: Any) -> Month:
    return seed_month()
