"""Celery tasks of governance: the idle-notebook reaper (beat every 60 s) and telemetry retention (hourly);
see CELERY_BEAT_SCHEDULE."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from scheduling.governance.reaper import reap_idle_notebooks as reap
from scheduling.governance.retention import prune_telemetry as prune


@shared_task(name="scheduling.governance.tasks.reap_idle_notebooks", ignore_result=True)
def reap_idle_notebooks() -> dict[str, list[int]]:
    """One reaper pass. Safe to run twice at once or to repeat: every stop and warning is a conditional write."""
    report = reap(now=timezone.now())
    return {"warned": report.warned, "reaped": report.reaped, "flagged": report.flagged, "cleared": report.cleared}


@shared_task(name="scheduling.governance.tasks.prune_telemetry", ignore_result=True)
def prune_telemetry() -> dict[str, object]:
    """Delete GPU telemetry older than YARD_TELEMETRY_KEEP_DAYS. Safe to run twice at once (deletes by id)."""
    pruned = prune(now=timezone.now())
    return {"deleted": pruned.deleted, "before": pruned.before.isoformat(), "done": pruned.done}
