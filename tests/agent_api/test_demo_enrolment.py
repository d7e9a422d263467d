"""The demo's enrolment token (seed_demo --agent-tokens, what every `make run` writes) expires as a real
one does, 24 h after it is made, and a re-seed revokes the one the run before wrote: a leaked demo
token does not register nodes for ever."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from scheduling.models import EnrolmentToken

pytestmark = pytest.mark.django_db


def _seed(path: Path) -> str:
    call_command("seed_demo", "--agent-tokens", str(path), "--no-history", stdout=io.StringIO())
    return json.loads(path.read_text())["enrolment"]


def _register(raw: str, name: str) -> int:
    body = {
        "name": name,
        "leaf": "leaf-x",
        "spine": "spine-x",
        "gpus": [{"index": 0, "uuid": f"GPU-{name}", "gpu_type": "H100", "nvlink_domain": "nv0", "pcie_switch": "sw0"}],
    }
    answer = Client().post(
        "/api/agent/v1/register", json.dumps(body), content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {raw}"
    )
    return answer.status_code


def test_the_demo_enrolment_token_expires_in_a_day_and_then_registers_nothing(tmp_path: Path) -> None:
    before = timezone.now()
    raw = _seed(tmp_path / "agent-tokens.json")
    token = EnrolmentToken.objects.get(name="demo", revoked_at__isnull=True)
    assert token.expires_at is not None
    assert before + timedelta(hours=24) <= token.expires_at <= timezone.now() + timedelta(hours=24)
    EnrolmentToken.objects.filter(pk=token.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert _register(raw, "late-node") == 401


def test_a_reseed_revokes_the_demo_token_the_run_before_wrote(tmp_path: Path) -> None:
    first = _seed(tmp_path / "one.json")
    second = _seed(tmp_path / "two.json")
    assert EnrolmentToken.objects.filter(name="demo", revoked_at__isnull=True).count() == 1
    assert _register(first, "old-node") == 401
    assert _register(second, "new-node") == 201
