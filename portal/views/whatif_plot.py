"""The what-if's wait plot, drawn on the server as inline SVG (as svg.py draws the sparklines): mean wait
per day of the units that change most, the live tree dashed and the draft solid, one colour a unit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from portal.views.common import TEAM_PALETTE

WIDTH, HEIGHT, PAD = 640, 220, 36


@dataclass(frozen=True)
class Line:
    name: str
    colour: str
    live: str  # SVG polyline points
    draft: str

    @property
    def dots(self) -> list[tuple[str, str]]:
        """The draft's points as dots too: a day alone (no neighbour to draw a line to) still shows."""
        return [tuple(p.split(",", 1)) for p in self.draft.split()]  # type: ignore[misc]


@dataclass(frozen=True)
class WaitPlot:
    lines: list[Line]
    top_h: float  # the y axis' top, hours
    days: int
    width: int = WIDTH
    height: int = HEIGHT
    pad: int = PAD

    @property
    def bottom(self) -> int:
        return self.height - self.pad

    @property
    def right(self) -> int:
        return self.width - 8


def _points(values: list[float | None], days: int, top: float) -> str:
    coords = []
    span_x, span_y = WIDTH - 8 - PAD, HEIGHT - 2 * PAD
    for day, value in enumerate(values):
        if value is None:
            continue
        x = PAD + (day + 0.5) / max(days, 1) * span_x
        y = HEIGHT - PAD - min(value / top, 1.0) * span_y
        coords.append(f"{x:.1f},{y:.1f}")
    return " ".join(coords)


def wait_plot(series: dict[str, Any] | None) -> WaitPlot | None:
    if not series or not series.get("units"):
        return None
    days = int(series["days"])
    values = [v for u in series["units"] for v in (*u["live"], *u["draft"]) if v is not None]
    top = max(values, default=1.0) or 1.0
    lines = [
        Line(u["name"], TEAM_PALETTE[i % len(TEAM_PALETTE)], _points(u["live"], days, top), _points(u["draft"], days, top))
        for i, u in enumerate(series["units"])
    ]
    return WaitPlot(lines, round(top, 1), days)
