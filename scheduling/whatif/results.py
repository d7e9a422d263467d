"""The answer of a what-if, side by side: per unit of the draft's subtree, the live tree's replay and the
draft's, the change, the units that change most first; the cluster's utilisation; a daily wait series
for the plot; the caveats. Plain JSON, stored on the run and read by the page and the CSV."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from statistics import fmean
from typing import Any

from scheduling.core.types import QuotaUnit
from scheduling.whatif.replay import TreeOutcome
from scheduling.whatif.selectors import WindowJobs
from tenants.models import OrgUnit

DAY_S = 86400.0
PLOTTED = 3  # units drawn in the wait plot: those that change most

CAVEATS = (
    "Jobs are replayed with their recorded run times: a job that would have run faster or slower elsewhere, "
    "or been resubmitted differently, is not modelled.",
    "Requeues after faults (a node lost, a GPU error) are not replayed: each job runs its recorded work once, "
    "apart from what the replayed scheduler itself preempts.",
    "Jobs submitted before the window (running at its start) are not replayed; fair share starts from what "
    "teams held before the window, decayed, for both trees alike, and a team's usage per GPU type within it is "
    "the replay's exact total split in the proportions it held each type at the scheduling cycles.",
    "The fleet is today's (every node and whole GPU the portal knows now, all in service); a preempted job "
    "is assumed to checkpoint hourly.",
)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _hours(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds / 3600, 3)


def _figures(job_ids: Sequence[str], outcome: TreeOutcome, guaranteed: int, span_s: float) -> dict[str, Any]:
    waits = [w for j in job_ids if (w := outcome.jobs[j].wait_s) is not None]
    jcts = [c for j in job_ids if (c := outcome.jobs[j].jct_s) is not None]
    return {
        "p50_wait_h": _hours(_pct(waits, 0.5)),
        "p95_wait_h": _hours(_pct(waits, 0.95)),
        "mean_wait_h": _hours(fmean(waits)) if waits else None,
        "avg_jct_h": _hours(fmean(jcts)) if jcts else None,
        "gpu_hours": round(sum(outcome.jobs[j].held_gpu_s for j in job_ids) / 3600, 1),
        "guaranteed_gpu_hours": round(guaranteed * span_s / 3600, 1),
        "guaranteed": guaranteed,
        "preemptions": sum(outcome.jobs[j].preempted for j in job_ids),
        "unfinished": sum(1 for j in job_ids if outcome.jobs[j].jct_s is None),
    }


def _delta(live: dict[str, Any], draft: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in live.items():
        other = draft.get(key)
        out[key] = None if value is None or other is None else round(other - value, 3)
    return out


def _utilisation(outcome: TreeOutcome, span_s: float) -> float:
    hours = math.ceil(span_s / 3600)
    busy = sum(v for h, v in outcome.busy_by_hour.items() if 0 <= h < hours)
    return round(busy / (outcome.total_gpus * hours * 3600), 4) if outcome.total_gpus else 0.0


def compare(
    *,
    live: TreeOutcome,
    draft: TreeOutcome,
    window: WindowJobs,
    units: Sequence[OrgUnit],
    trees: tuple[Sequence[QuotaUnit], Sequence[QuotaUnit]],
    span_s: float,
) -> dict[str, Any]:
    guaranteed = [{u.name: sum(u.guaranteed.values()) for u in tree} for tree in trees]
    jobs_of_team: dict[int, list[str]] = defaultdict(list)
    for job_id, team_id in window.team_of.items():
        jobs_of_team[team_id].append(job_id)
    base_depth = min((u.depth for u in units), default=0)
    rows = []
    for unit in units:
        ids = [j for u in units if u.path.startswith(unit.path) for j in jobs_of_team.get(u.pk, ())]
        before = _figures(ids, live, guaranteed[0].get(unit.slug, 0), span_s)
        after = _figures(ids, draft, guaranteed[1].get(unit.slug, 0), span_s)
        delta = _delta(before, after)
        rows.append(
            {
                "id": unit.pk,
                "name": unit.name,
                "slug": unit.slug,
                "kind": unit.get_kind_display(),
                "depth": min(unit.depth - base_depth, 3),
                "jobs": len(ids),
                "live": before,
                "draft": after,
                "delta": delta,
                "change_h": abs(delta["mean_wait_h"] or 0.0),
            }
        )
    # The biggest winners and losers first (by how much their mean wait moved), then the tree's order.
    order = {r["id"]: i for i, r in enumerate(rows)}
    rows.sort(key=lambda r: (-r["change_h"], order[r["id"]]))
    all_ids = list(window.team_of)
    plotted = [r for r in rows if r["jobs"] and r["change_h"] > 0][:PLOTTED]
    return {
        "jobs": len(window.jobs),
        "skipped": window.skipped,
        "reshaped": live.reshaped,
        "replay_s": [round(live.wall_s, 1), round(draft.wall_s, 1)],
        "cycles": [live.cycles, draft.cycles],
        "cluster": {
            "live": {**_figures(all_ids, live, 0, span_s), "utilisation": _utilisation(live, span_s)},
            "draft": {**_figures(all_ids, draft, 0, span_s), "utilisation": _utilisation(draft, span_s)},
        },
        "units": rows,
        "series": {
            "days": math.ceil(span_s / DAY_S),
            "units": [_daily(r, units, jobs_of_team, window, live, draft, span_s) for r in plotted],
        },
        "caveats": list(CAVEATS),
    }


def _daily(
    row: dict[str, Any],
    units: Sequence[OrgUnit],
    jobs_of_team: dict[int, list[str]],
    window: WindowJobs,
    live: TreeOutcome,
    draft: TreeOutcome,
    span_s: float,
) -> dict[str, Any]:
    """Mean wait (hours) of the unit's jobs submitted each day, under each tree; None for a day without jobs."""
    path = next(u.path for u in units if u.pk == row["id"])
    submitted = {j.job_id: j.submit_s for j in window.jobs}
    ids = [j for u in units if u.path.startswith(path) for j in jobs_of_team.get(u.pk, ())]
    days = math.ceil(span_s / DAY_S)
    series = {}
    for label, outcome in (("live", live), ("draft", draft)):
        by_day: dict[int, list[float]] = defaultdict(list)
        for j in ids:
            wait = outcome.jobs[j].wait_s
            if wait is not None:
                by_day[min(int(submitted[j] // DAY_S), days - 1)].append(wait)
        series[label] = [_hours(fmean(by_day[d])) if by_day.get(d) else None for d in range(days)]
    return {"name": row["name"], **series}
