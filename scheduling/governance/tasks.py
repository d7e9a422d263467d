"""Celery tasks of governance: the idle-notebook reaper (beat every 60 s, see CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from scheduling.governance.reaper import reap_idle_notebooks as reap


@shared_task(name="scheduling.governance.tasks.reap_idle_notebooks", ignore_result=True)
def reap_idle_notebooks() -> dict[str, list[int]]:
    """One reaper pass. Safe to run twice at once or to repeat: every stop and warning is a conditional write."""
    report = reap(now=timezone.now())
    return {"warned": report.warned, "reaped": report.reaped, "flagged": report.flagged, "cleared": report.cleared}
