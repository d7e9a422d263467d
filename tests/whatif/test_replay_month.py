"""The what-if over a real month of history: a draft that moves guarantee from one team to another, the
replay under both trees, and what it must say."""

from __future__ import annotations

from typing import Any

import pytest

from scheduling.whatif.models import RunState, WhatIfRun
from scheduling.whatif.services import draft_create, draft_quota_set, whatif_run
from tests.whatif.conftest import Month

pytestmark = pytest.mark.slow


def _run(month: Month, draft: Any) -> dict[str, Any]:
    run = WhatIfRun.objects.create(draft=draft, created_by=month.admin, window_start=month.start, window_end=month.end, jobs=1)
    assert whatif_run(run_id=run.pk) == RunState.DONE
    run.refresh_from_db()
    assert run.progress == 1.0
    return run.result


def _unit(result: dict[str, Any], name: str) -> dict[str, Any]:
    return next(u for u in result["units"] if u["name"] == name)


def test_guarantee_moved_from_perception_to_generative_video_shortens_the_receivers_waits(month: Month) -> None:
    draft = draft_create(actor=month.rita, root=month.unit("Research"))
    # Vision's 48 H100: perception 32 -> 8, generative-video 16 -> 40 (limits raised to let it hold them).
    draft_quota_set(actor=month.rita, draft=draft, unit=month.unit("perception"), gpu_type="H100", guaranteed=8, limit=96)
    draft_quota_set(actor=month.rita, draft=draft, unit=month.unit("generative-video"), gpu_type="H100", guaranteed=40, limit=96)
    result = _run(month, draft)

    receiver, giver = _unit(result, "generative-video"), _unit(result, "perception")
    assert receiver["jobs"] > 0 and giver["jobs"] > 0
    assert receiver["draft"]["mean_wait_h"] < receiver["live"]["mean_wait_h"]
    assert receiver["draft"]["p95_wait_h"] < receiver["live"]["p95_wait_h"]
    assert giver["draft"]["mean_wait_h"] > giver["live"]["mean_wait_h"]
    assert receiver["draft"]["guaranteed"] == receiver["live"]["guaranteed"] + 24
    # Only Research's subtree is shown to its org admin, the units that change most first.
    names = [u["name"] for u in result["units"]]
    assert "ranking" not in names and set(names) >= {"Research", "Vision", "perception", "pretraining"}
    changes = [u["change_h"] for u in result["units"]]
    assert changes == sorted(changes, reverse=True)
    assert result["series"]["units"] and result["series"]["units"][0]["name"] == result["units"][0]["name"]
    assert 0 < result["cluster"]["live"]["utilisation"] <= 1
    assert result["caveats"]


def test_an_unchanged_draft_replays_exactly_as_the_live_tree(month: Month) -> None:
    result = _run(month, draft_create(actor=month.admin, root=month.unit("Acme AI Cluster")))
    assert result["jobs"] > 300
    for unit in result["units"]:
        assert unit["live"] == unit["draft"], unit["name"]
    assert result["cluster"]["live"] == result["cluster"]["draft"]
