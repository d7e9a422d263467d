"""The monthly usage report: accounting figures rolled up business unit → department → team.

One builder feeds the page, its CSV, the per-job CSV and the API, so they always agree.
Rows are one per (unit, GPU type) over every GPU type of the report: a regular grid, so the CSV
holds exactly the table's cells. Hours follow the team's *current* place in the tree (see accounting).
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Q
from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from scheduling.governance.accounting import JobUsage, Month, Usage, job_usage, usage_by
from scheduling.models import Allocation, JobKind
from scheduling.selectors import borrowed_beyond
from tenants.models import OrgUnit, Quota, UnitKind

UNIT_COLUMNS = [
    "month",
    "unit_id",
    "unit",
    "unit_kind",
    "unit_path",
    "parent_id",
    "gpu_type",
    "guaranteed_gpus",
    "guaranteed_gpu_hours",
    "used_gpu_hours",
    "borrowed_gpu_hours",
    "lost_to_preemption_gpu_hours",
    "idle_reaped_gpu_hours",
    "efficiency_ratio",
]
JOB_COLUMNS = [
    "month",
    "job_id",
    "job_name",
    "user",
    "team_id",
    "team",
    "team_path",
    "tier",
    "kind",
    "gpu_type",
    "state",
    "used_gpu_hours",
    "reclaimable_gpu_hours",
    "lost_to_preemption_gpu_hours",
    "idle_reaped_gpu_hours",
    "efficiency_ratio",
]
DECIMALS = 4  # GPU-hours to 0.36 s: exact enough for finance, short enough to read


def _hours(seconds: float) -> float:
    return round(seconds / 3600, DECIMALS)


def _ratio(value: float | None) -> float | None:
    return None if value is None else round(value, DECIMALS)


@dataclass
class Line:
    """One unit and one GPU type."""

    gpu_type: str
    guaranteed: int
    guaranteed_gpu_hours: float
    usage: Usage = field(default_factory=Usage)


@dataclass
class UnitNode:
    unit: OrgUnit
    depth: int
    names: list[str]  # from the report's top down to this unit
    lines: list[Line] = field(default_factory=list)
    children: list[UnitNode] = field(default_factory=list)

    @property
    def total(self) -> Usage:
        total = Usage()
        for line in self.lines:
            total.add(line.usage)
        return total

    @property
    def guaranteed_gpu_hours(self) -> float:
        return sum(line.guaranteed_gpu_hours for line in self.lines)

    @property
    def path_label(self) -> str:
        return " / ".join(self.names)


@dataclass
class Report:
    month: Month
    now: datetime
    gpu_types: list[str]
    tops: list[UnitNode]
    jobs: list[JobUsage]
    team_paths: dict[int, str]
    team_daily_s: dict[int, dict[int, float]]

    def nodes(self) -> list[UnitNode]:
        """Every unit, depth first (the table's order)."""
        out: list[UnitNode] = []
        stack = list(reversed(self.tops))
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    def teams(self) -> list[UnitNode]:
        return [n for n in self.nodes() if n.unit.kind == UnitKind.TEAM]

    @property
    def by_kind(self) -> list[tuple[str, Usage]]:
        """Used hours per kind of work (batch jobs, notebooks, service replicas), in JobKind's order."""
        totals = usage_by(self.jobs, "kind")
        return [(label, totals[(kind,)]) for kind, label in JobKind.choices if (kind,) in totals]

    @property
    def total(self) -> Usage:
        total = Usage()
        for top in self.tops:
            total.add(top.total)
        return total

    @property
    def guaranteed_gpu_hours(self) -> float:
        return sum(top.guaranteed_gpu_hours for top in self.tops)


def top_units(units: Iterable[OrgUnit]) -> list[OrgUnit]:
    """The units none of whose ancestors is in ``units``: the roots of the visible forest."""
    units = list(units)
    ids = {u.pk for u in units}
    return sorted(
        (u for u in units if not any(int(a) in ids for a in u.path.strip("/").split("/")[:-1] if a)), key=lambda u: u.path
    )


def build_report(*, month: Month, tops: Sequence[OrgUnit], now: datetime) -> Report:
    """The report of ``month`` (up to ``now``) for the subtrees under ``tops`` (which must not nest)."""
    if not tops:
        return Report(month, now, [], [], [], {}, {})
    units = list(OrgUnit.objects.filter(reduce(or_, [Q(path__startswith=t.path) for t in tops])).order_by("path"))
    by_id = {u.pk: u for u in units}
    team_ids = [u.pk for u in units if u.kind == UnitKind.TEAM]
    jobs = job_usage(month=month, now=now, team_ids=team_ids)
    quotas = {(q.unit_id, q.gpu_type): q.guaranteed for q in Quota.objects.filter(unit_id__in=by_id)}
    gpu_types = sorted({t for _, t in quotas} | {j.gpu_type for j in jobs})

    # Every team's figures are added to each unit on its current path inside the report: the
    # subtrees partition the teams, so each parent is exactly the sum of its children.
    per_unit: dict[tuple[int, str], Usage] = defaultdict(Usage)
    team_daily: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for row in jobs:
        for unit_id in _path_ids(by_id[row.team_id]):
            if unit_id in by_id:
                per_unit[(unit_id, row.gpu_type)].add(row.usage)
        for day, seconds in row.daily_s.items():
            team_daily[row.team_id][day] += seconds

    # Borrowed: the GPU-hours a team held *beyond its guarantee* (a parent: the sum of its teams'), the
    # figure the API and the quota page show as GPUs (scheduling.selectors.borrowed_beyond), not the
    # hours of every job that ran on borrowed quota (a 192-GPU gang 97 GPUs past the guarantee is 97
    # borrowed GPUs, though all 192 are reclaimable). The per-job CSV shows the latter, as reclaimable.
    beyond = _beyond_guarantee(month=month, now=now, team_ids=team_ids, quotas=quotas)
    for (team_id, gpu_type), seconds in beyond.items():
        for unit_id in _path_ids(by_id[team_id]):
            if unit_id in by_id:
                per_unit[(unit_id, gpu_type)].borrowed_s += seconds

    nodes: dict[int, UnitNode] = {}
    top_ids = {t.pk for t in tops}
    result_tops: list[UnitNode] = []
    for unit in units:  # path order: parents before children
        parent = nodes.get(unit.parent_id) if unit.pk not in top_ids and unit.parent_id is not None else None
        node = UnitNode(unit, parent.depth + 1 if parent else 0, [*(parent.names if parent else []), unit.name])
        node.lines = [
            Line(t, quotas.get((unit.pk, t), 0), quotas.get((unit.pk, t), 0) * month.hours, per_unit.get((unit.pk, t), Usage()))
            for t in gpu_types
        ]
        nodes[unit.pk] = node
        (parent.children if parent else result_tops).append(node)
    team_paths = {tid: nodes[tid].path_label for tid in team_ids}
    return Report(month, now, gpu_types, result_tops, jobs, team_paths, {k: dict(v) for k, v in team_daily.items()})


def _beyond_guarantee(
    *, month: Month, now: datetime, team_ids: list[int], quotas: dict[tuple[int, str], int]
) -> dict[tuple[int, str], float]:
    """(team, GPU type) -> GPU-seconds held beyond the team's guarantee during the month (up to ``now``):
    the integral of ``borrowed_beyond`` (max(GPUs held - guaranteed, 0)), swept over the allocations'
    starts and ends. The guarantee is today's (quotas are not versioned)."""
    start, end = month.start, min(month.end, now)
    if end <= start or not team_ids:
        return {}
    rows = (
        Allocation.objects.filter(job__team_id__in=team_ids, allocated_at__lt=end)
        .filter(Q(released_at__isnull=True) | Q(released_at__gt=start))
        .values_list("job__team_id", "job__gpu_type", "allocated_at", "released_at")
    )
    events: dict[tuple[int, str], list[tuple[datetime, int]]] = defaultdict(list)
    for team_id, gpu_type, allocated, released in rows.iterator(chunk_size=5000):
        lo, hi = max(allocated, start), min(released or now, end)
        if hi > lo:
            events[(team_id, gpu_type)] += [(lo, 1), (hi, -1)]
    out: dict[tuple[int, str], float] = {}
    for key, points in events.items():
        guaranteed = quotas.get(key, 0)
        points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same moment
        held, total, last = 0, 0.0, start
        for moment, change in points:
            total += borrowed_beyond(used=held, guaranteed=guaranteed) * (moment - last).total_seconds()
            held, last = held + change, moment
        if total:
            out[key] = total
    return out


def _path_ids(unit: OrgUnit) -> list[int]:
    return [int(x) for x in unit.path.strip("/").split("/") if x]


# --------------------------------------------------------------------------- rows (CSV and API)


def unit_rows(report: Report) -> list[dict[str, Any]]:
    rows = []
    for node in report.nodes():
        for line in node.lines:
            rows.append(
                {
                    "month": report.month.label,
                    "unit_id": node.unit.pk,
                    "unit": node.unit.name,
                    "unit_kind": node.unit.kind,
                    "unit_path": node.path_label,
                    "parent_id": node.unit.parent_id,
                    "gpu_type": line.gpu_type,
                    "guaranteed_gpus": line.guaranteed,
                    "guaranteed_gpu_hours": round(line.guaranteed_gpu_hours, DECIMALS),
                    "used_gpu_hours": _hours(line.usage.used_s),
                    "borrowed_gpu_hours": _hours(line.usage.borrowed_s),
                    "lost_to_preemption_gpu_hours": _hours(line.usage.lost_s),
                    "idle_reaped_gpu_hours": _hours(line.usage.reaped_s),
                    "efficiency_ratio": _ratio(line.usage.efficiency),
                }
            )
    return rows


def job_rows(report: Report) -> list[dict[str, Any]]:
    return [
        {
            "month": report.month.label,
            "job_id": j.job_id,
            "job_name": j.job_name,
            "user": j.username,
            "team_id": j.team_id,
            "team": report.team_paths.get(j.team_id, "").rsplit(" / ", 1)[-1],
            "team_path": report.team_paths.get(j.team_id, ""),
            "tier": j.tier,
            "kind": j.kind,
            "gpu_type": j.gpu_type,
            "state": j.state,
            "used_gpu_hours": _hours(j.usage.used_s),
            "reclaimable_gpu_hours": _hours(j.usage.reclaimable_s),
            "lost_to_preemption_gpu_hours": _hours(j.usage.lost_s),
            "idle_reaped_gpu_hours": _hours(j.usage.reaped_s),
            "efficiency_ratio": _ratio(j.usage.efficiency),
        }
        for j in report.jobs
    ]


def to_csv(rows: Iterable[dict[str, Any]], columns: Sequence[str]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\r\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in columns})
    return out.getvalue()


# --------------------------------------------------------------------------- charts (inline SVG)

PALETTE = ["#2456d3", "#1f8a4c", "#b7791f", "#9333ea", "#c0392b", "#0f766e", "#db2777", "#4b5563"]
MAX_SERIES = 7  # more teams than this are summed as "others" so the colours stay readable


def _series(report: Report) -> list[tuple[str, dict[int, float]]]:
    teams = sorted(report.teams(), key=lambda n: -n.total.used_s)
    named = [(n.unit.name, report.team_daily_s.get(n.unit.pk, {})) for n in teams[:MAX_SERIES] if n.total.used_s > 0]
    rest: dict[int, float] = defaultdict(float)
    for n in teams[MAX_SERIES:]:
        for day, s in report.team_daily_s.get(n.unit.pk, {}).items():
            rest[day] += s
    if rest:
        named.append(("others", dict(rest)))
    return named


def daily_usage_svg(report: Report) -> SafeString:
    """Stacked bars: GPU-hours per day of the month, one colour per team."""
    days = report.month.days()
    series = _series(report)
    width, height, left, bottom, top = 720, 260, 56, 28, 16
    totals = [sum(s.get(d, 0.0) for _, s in series) / 3600 for d in range(len(days))]
    peak = max([*totals, 1.0])
    slot = (width - left - 8) / len(days)
    scale = (height - bottom - top) / peak
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height + 12 + 22 * ((len(series) + 3) // 4)}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>GPU-hours per day by team, {report.month.label}</title>',
        f'<text x="4" y="{top + 4}" font-size="13">{peak:,.0f} h</text>',
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - 8}" y2="{height - bottom}" stroke="#9ca3af"/>',
    ]
    for d in range(len(days)):
        y = float(height - bottom)
        for i, (name, s) in enumerate(series):
            h = s.get(d, 0.0) / 3600 * scale
            if h <= 0:
                continue
            y -= h
            parts.append(
                f'<rect x="{left + d * slot + 1:.1f}" y="{y:.1f}" width="{max(slot - 2, 1):.1f}" height="{h:.1f}" '
                f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(name)}, day {d + 1}: '
                f"{s.get(d, 0.0) / 3600:.1f} GPU-h</title></rect>"
            )
        if d % 5 == 0:
            parts.append(f'<text x="{left + d * slot:.1f}" y="{height - 8}" font-size="13">{d + 1}</text>')
    for i, (name, _) in enumerate(series):
        x, y = 8 + (i % 4) * 176, height + 8 + 22 * (i // 4)
        parts.append(f'<rect x="{x}" y="{y}" width="14" height="14" fill="{PALETTE[i % len(PALETTE)]}"/>')
        parts.append(f'<text x="{x + 19}" y="{y + 12}" font-size="14">{escape(name)}</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every interpolated name is escaped above


def used_vs_guaranteed_svg(report: Report) -> SafeString:
    """Per team: a bar of used GPU-hours against a tick at its guaranteed GPU-hours."""
    teams = [n for n in report.teams() if n.total.used_s > 0 or n.guaranteed_gpu_hours > 0]
    # Big enough to read at the card's width (the issue: "tiny text and bars too thin to see").
    row_h, bar_h, label_w, width = 36, 24, 170, 720
    height = max(len(teams), 1) * row_h + 30
    peak = max([1.0, *(max(n.total.used_gpu_hours, n.guaranteed_gpu_hours) for n in teams)])
    scale = (width - label_w - 150) / peak
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {width} {height}" xmlns="http://www.w3.org/2000/svg">'
        f"<title>Used vs guaranteed GPU-hours per team, {report.month.label}</title>"
    ]
    for i, n in enumerate(teams):
        y = 6 + i * row_h
        used, guaranteed = n.total.used_gpu_hours, n.guaranteed_gpu_hours
        colour = "#c0392b" if used > guaranteed else "#1f8a4c"
        parts.append(f'<text x="0" y="{y + 17}" font-size="14">{escape(n.unit.name)}</text>')
        parts.append(f'<rect x="{label_w}" y="{y}" width="{width - label_w - 150}" height="{bar_h}" fill="#eef0f4"/>')
        parts.append(
            f'<rect x="{label_w}" y="{y}" width="{max(used * scale, 2 if used else 0):.1f}" height="{bar_h}" fill="{colour}"/>'
        )
        gx = label_w + guaranteed * scale
        parts.append(f'<line x1="{gx:.1f}" y1="{y - 3}" x2="{gx:.1f}" y2="{y + bar_h + 3}" stroke="#111827" stroke-width="3"/>')
        parts.append(f'<text x="{width - 144}" y="{y + 17}" font-size="13">{used:,.0f} / {guaranteed:,.0f} h</text>')
    parts.append(f'<text x="{label_w}" y="{height - 6}" font-size="13">bar: used · tick: guaranteed (GPU-hours)</text>')
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every interpolated name is escaped above
