"""Celery tasks of the scheduler: the cycle. Tasks take ids (or nothing) and call one function."""

from __future__ import annotations

from celery import shared_task

from scheduling.cycle import run_cycle_once


# Idempotent (a second cycle on the same state changes nothing, and the lease keeps cycles
# apart), so it alone opts into acks_late: a worker SIGKILLed mid-cycle gets its cycle redelivered.
@shared_task(name="scheduling.tasks.run_cycle", acks_late=True, ignore_result=True)
def run_cycle() -> dict[str, object]:
    result = run_cycle_once()
    return {"ran": result.ran, "epoch": result.epoch, "placed": len(result.placed), "seconds": round(result.seconds, 3)}
