"""A what-if through a real Celery worker process (`celery -A portal worker`) on the test database and
Redis: started by the service, sent once the run commits, run to the end with its progress written as it
goes; a second run cancelled while it replays stops at its next progress report."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from portal.celery import app
from scheduling.whatif.models import RunState, WhatIfRun
from scheduling.whatif.services import draft_create, draft_quota_set, whatif_cancel, whatif_start
from tests.cycle.workers import Worker
from tests.whatif.conftest import seed_month

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def worker(transactional_db: Any, tmp_path: Path) -> Iterator[Worker]:
    app.control.purge()  # stale messages of earlier tests
    w = Worker("whatif", tmp_path)
    w.wait_ready()
    yield w
    w.stop()


def _until(what: str, check: Any, timeout: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_worker_runs_a_whatif_to_the_end_and_another_is_cancelled_midway(worker: Worker) -> None:
    month = seed_month()
    draft = draft_create(actor=month.admin, root=month.unit("Acme AI Cluster"))
    draft_quota_set(actor=month.admin, draft=draft, unit=month.unit("perception"), gpu_type="H100", guaranteed=8, limit=96)
    run = whatif_start(actor=month.admin, draft=draft, start=month.start, end=month.end)
    seen: list[float] = []

    def done() -> bool:
        run.refresh_from_db()
        seen.append(run.progress)
        return run.finished

    _until("the what-if to finish", done)
    assert run.state == RunState.DONE, f"{run.state}: {run.message}\n{worker.log_path.read_text()[-3000:]}"
    assert run.result is not None and run.result["jobs"] > 300
    assert any(0 < p < 1 for p in seen), "no progress was written while it ran"

    second = whatif_start(actor=month.admin, draft=draft, start=month.start, end=month.end)
    _until(
        "the second run to replay",
        lambda: WhatIfRun.objects.filter(pk=second.pk, state=RunState.RUNNING, progress__gt=0).exists(),
    )
    assert whatif_cancel(run=second)
    _until("the cancel", lambda: WhatIfRun.objects.filter(pk=second.pk, state=RunState.CANCELLED).exists(), timeout=30)
    second.refresh_from_db()
    assert second.result is None and second.progress < 1
