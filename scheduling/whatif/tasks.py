"""The what-if's Celery task: it takes the run's id and calls one service."""

from __future__ import annotations

from celery import shared_task

from scheduling.whatif.services import whatif_run


@shared_task(name="scheduling.whatif.tasks.run_whatif", ignore_result=True)
def run_whatif(run_id: int) -> str:
    return whatif_run(run_id=run_id)
