"""How long GPU telemetry is kept: GpuWindow rows older than ``YARD_TELEMETRY_KEEP_DAYS`` are deleted.

One row per GPU per window (a minute) is 14.4 million rows a day at 10,000 GPUs (docs/scale.md), and
nothing reads them after the reports: the reaper looks back an idle timeout, the usage report's
efficiency figure the month it covers. The default, 62 days, keeps the current and the previous month
whole on any day of the month; a report of an older month shows its efficiency as not measured (the
GPU-hours, from allocations, are kept for ever).

Deleted in batches of ``batch`` rows, oldest first, each its own short statement, so that the beat's
hourly pass never holds a long lock over the table the heartbeats write; at most ``max_batches`` per
pass (the next pass goes on).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import cast

from django.conf import settings

from scheduling.models import GpuWindow


@dataclass(frozen=True)
class Pruned:
    deleted: int
    before: datetime
    done: bool  # False: there is more to delete than this pass may (max_batches)


def keep_days() -> int:
    return int(cast(int, settings.YARD["TELEMETRY_KEEP_DAYS"]))


def prune_telemetry(*, now: datetime, batch: int = 20_000, max_batches: int = 50) -> Pruned:
    before = now - timedelta(days=keep_days())
    deleted = 0
    for _ in range(max_batches):
        ids = list(GpuWindow.objects.filter(start__lt=before).order_by("start").values_list("pk", flat=True)[:batch])
        if not ids:
            return Pruned(deleted, before, True)
        # No signals or cascades on GpuWindow: Django deletes these in one statement, without reading them.
        deleted += GpuWindow.objects.filter(pk__in=ids).delete()[0]
    return Pruned(deleted, before, not GpuWindow.objects.filter(start__lt=before).exists())
