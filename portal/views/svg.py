"""Per-GPU utilisation sparklines, drawn on the server as inline SVG (no chart library, no JavaScript)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from scheduling.models import GpuWindow

WIDTH, HEIGHT = 160, 28


@dataclass(frozen=True)
class Sparkline:
    gpu_id: int
    points: str  # SVG polyline points, "x,y x,y ..."
    last: float | None  # the latest one-minute mean, percent
    count: int

    @property
    def single(self) -> tuple[float, float] | None:
        """A lone window is drawn as a dot: a one-point polyline is invisible."""
        if self.count != 1:
            return None
        x, y = self.points.split(",")
        return float(x), float(y)


def _points(values: list[tuple[datetime, float]], *, since: datetime, minutes: int) -> str:
    span = minutes * 60
    coords = []
    for start, pct in values:
        x = max(0.0, min(1.0, (start - since).total_seconds() / span)) * WIDTH
        y = HEIGHT - 1 - max(0.0, min(100.0, pct)) / 100 * (HEIGHT - 2)
        coords.append(f"{x:.1f},{y:.1f}")
    return " ".join(coords)


def sparklines(gpu_ids: Iterable[int], *, now: datetime, minutes: int = 60) -> dict[int, Sparkline]:
    """One query for every GPU's windows of the last ``minutes``."""
    ids = list(gpu_ids)
    since = now - timedelta(minutes=minutes)
    series: dict[int, list[tuple[datetime, float]]] = defaultdict(list)
    rows = (
        GpuWindow.objects.filter(gpu_id__in=ids, start__gte=since)
        .order_by("gpu_id", "start")
        .values_list("gpu_id", "start", "utilization_sum", "samples")
    )
    for gpu_id, start, total, samples in rows:
        series[gpu_id].append((start, total / samples if samples else 0.0))
    return {
        gpu_id: Sparkline(
            gpu_id, _points(series[gpu_id], since=since, minutes=minutes), series[gpu_id][-1][1], len(series[gpu_id])
        )
        for gpu_id in ids
        if series[gpu_id]
    }
