"""Celery tasks: the collector (beat, YARD_NOTIFY_SCAN_INTERVAL_S) and one delivery per notification.

They run in the same workers as the scheduling cycle but never in its transaction or its code path:
the cycle records JobEvents as it always did and returns; the collector reads them later. Each task
is short (one SMTP or HTTP call with a timeout); a deployment that wants them off the cycle's workers
routes them to their own queue with YARD_NOTIFY_QUEUE.
"""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from notifications.services import notification_deliver, notifications_collect


@shared_task(name="notifications.tasks.collect", ignore_result=True)
def collect() -> dict[str, int]:
    """One collecting pass. Safe with any number of workers: the watermark's row lock and unique keys."""
    report = notifications_collect(now=timezone.now())
    return {"events": report.events, "deliveries": report.deliveries}


@shared_task(name="notifications.tasks.deliver", ignore_result=True, acks_late=True)
def deliver(notification_id: int) -> None:
    """Send one notification; on failure queue the next try with backoff (the row keeps the schedule).

    acks_late is safe: the send is claimed by a conditional UPDATE, so a redelivered task finds it taken.
    """
    retry_in = notification_deliver(notification_id=notification_id, now=timezone.now())
    if retry_in is not None:
        deliver.apply_async((notification_id,), countdown=retry_in)
