"""Celery tasks of the agent side: node liveness, on a beat tick (every 10 s)."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from scheduling.agent.liveness import nodes_check


@shared_task(name="scheduling.agent.tasks.check_nodes", ignore_result=True)
def check_nodes() -> dict[str, list[object]]:
    """Idempotent: a second run at the same moment finds nothing left to change."""
    report = nodes_check(now=timezone.now())
    return {"not_ready": list(report.not_ready), "down": list(report.down), "requeued_jobs": list(report.requeued_jobs)}
