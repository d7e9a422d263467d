"""The service controller's Celery task: on its beat (YARD_SERVICE_TICK_S) and when kicked (kick.py)."""

from __future__ import annotations

from celery import shared_task

from scheduling.serving.controller import reconcile_all


# Idempotent: a second run on the same state changes nothing (each service is reconciled under its row lock).
@shared_task(name="scheduling.serving.tasks.reconcile_services", ignore_result=True)
def reconcile_services() -> dict[str, int]:
    return reconcile_all()
