"""From a replay's raw record to the numbers the evaluation reports, and their markdown.

Job metrics (JCT, queueing delay) are over jobs submitted inside the metrics
window (``submit_time >= busy_from``, the trace README's steady state); GPU
utilisation and team shares are integrated over the window from ``busy_from``
to the last submission, the same interval for every policy.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from scheduling.sim.replay_types import ReplayResult

GANG_BUCKETS = (("1", 1, 1), ("2-8", 2, 8), (">8", 9, 1 << 30))


@dataclass(frozen=True, slots=True)
class Delays:
    count: int
    mean: float
    median: float
    p95: float


@dataclass(slots=True)
class TeamShare:
    team: str
    guarantee: int
    demand_h: float
    used_gpu_h: float
    share_of_guarantee: float  # GPU-h used / (guarantee x hours with demand); nan without guarantee
    honoured: float  # integral min(held, guarantee, demand) / integral min(guarantee, demand)


@dataclass(slots=True)
class Summary:
    policy: str
    nodes: int
    time_limits: str
    jobs: int
    jct_mean: float
    jct_median: float
    queue: Delays
    queue_by_gang: dict[str, Delays]
    utilisation: float
    multinode_gangs: int
    multinode_one_leaf: float
    mean_leaves: float
    teams: list[TeamShare]
    min_honoured: float
    preemptions: int
    lost_gpu_h: float
    wall_s: float
    plan_s: float
    cycles: int
    unfinished: int
    extra: dict[str, float] = field(default_factory=dict)
    workload: str = "philly"
    slowdown: float = 0.0  # the replay's cost of spanning leaves (ReplayConfig.span_slowdown)
    slowed: float = math.nan  # share of multi-node placements in the window that ran slowed
    slow_gpu_h: float = 0.0  # GPU-hours of useful work's extra run time on slowed placements
    at_risk_starts: int = 0  # starts at risk on reserved GPUs (whole replay)
    window_start: float = 0.0
    window_end: float = 0.0
    # for the plots: hour index -> utilisation, and every job's queueing delay (s)
    util_series: dict[int, float] = field(default_factory=dict)
    queue_delays: list[float] = field(default_factory=list)
    cpu_s: float = math.nan  # CPU seconds of the replay's process (wall_s counts the machine's other load too)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile of sorted ``values`` (nan when empty)."""
    if not values:
        return math.nan
    k = max(0, math.ceil(q / 100.0 * len(values)) - 1)
    return values[k]


def delays(values: list[float]) -> Delays:
    v = sorted(values)
    if not v:
        return Delays(0, math.nan, math.nan, math.nan)
    return Delays(len(v), statistics.fmean(v), statistics.median(v), percentile(v, 95))


def summarise(r: ReplayResult, *, time_limits: str, workload: str = "philly", slowdown: float = 0.0) -> Summary:
    lo, hi = r.window
    done = [s for s in r.jobs if s.trace.submit_time >= lo and s.finish is not None]
    jct = [s.finish - s.trace.submit_time for s in done if s.finish is not None]
    queued = [s.queued_s for s in done]
    by_gang = {label: delays([s.queued_s for s in done if a <= s.gpus <= b]) for label, a, b in GANG_BUCKETS}
    per_node = r.shape.gpus_per_node
    multi = [p for p in r.placements if p.gpus > per_node and p.time >= lo]
    teams = []
    for team, t in sorted(r.teams.items()):
        if t.demand_s <= 0:
            continue
        teams.append(
            TeamShare(
                team=team,
                guarantee=t.guarantee,
                demand_h=t.demand_s / 3600,
                used_gpu_h=t.used / 3600,
                share_of_guarantee=t.used / (t.guarantee * t.demand_s) if t.guarantee else math.nan,
                honoured=t.honoured / t.entitled if t.entitled else math.nan,
            )
        )
    honoured = [t.honoured for t in teams if not math.isnan(t.honoured)]
    capacity = r.shape.total_gpus
    window = max(hi - lo, 1e-9)
    return Summary(
        policy=r.policy,
        nodes=r.shape.nodes,
        time_limits=time_limits,
        jobs=len(done),
        jct_mean=statistics.fmean(jct) if jct else math.nan,
        jct_median=statistics.median(jct) if jct else math.nan,
        queue=delays(queued),
        queue_by_gang=by_gang,
        utilisation=r.busy_window_gpu_s / (capacity * window),
        multinode_gangs=len(multi),
        multinode_one_leaf=sum(p.leaves == 1 for p in multi) / len(multi) if multi else math.nan,
        mean_leaves=statistics.fmean(p.leaves for p in multi) if multi else math.nan,
        teams=teams,
        min_honoured=min(honoured) if honoured else math.nan,
        preemptions=r.preemptions,
        lost_gpu_h=sum(s.lost_gpu_s for s in r.jobs) / 3600,
        wall_s=r.wall_s,
        plan_s=r.plan_s,
        cycles=r.cycles,
        unfinished=len(r.unfinished),
        extra=r.extra,
        workload=workload,
        slowdown=slowdown,
        slowed=sum(p.slowed for p in multi) / len(multi) if multi else math.nan,
        slow_gpu_h=sum(s.slow_gpu_s for s in r.jobs) / 3600,
        at_risk_starts=sum(s.at_risk for s in r.jobs),
        window_start=lo,
        window_end=hi,
        util_series={h: v / (capacity * 3600) for h, v in r.util_bins.items()},
        queue_delays=queued,
    )


# --------------------------------------------------------------------------- markdown


def _s(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:,.0f}"


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.1f} %"


def label(s: Summary) -> str:
    return s.policy if s.time_limits == "-" else f"{s.policy} ({s.time_limits})"


def headline_table(rows: list[Summary]) -> str:
    head = (
        "| policy | avg JCT (s) | median JCT (s) | avg queue (s) | median queue (s) | p95 queue (s) "
        "| GPU util (busy window) | multi-node gangs in one leaf | mean leaves | min team guarantee honoured "
        "| preemptions | GPU-h lost | replay wall (s) |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for s in rows:
        lines.append(
            f"| {label(s)} | {_s(s.jct_mean)} | {_s(s.jct_median)} "
            f"| {_s(s.queue.mean)} | {_s(s.queue.median)} | {_s(s.queue.p95)} "
            f"| {_pct(s.utilisation)} | {_pct(s.multinode_one_leaf)} "
            f"| {'–' if math.isnan(s.mean_leaves) else f'{s.mean_leaves:.2f}'} | {_pct(s.min_honoured)} "
            f"| {s.preemptions:,} | {s.lost_gpu_h:,.0f} | {s.wall_s:.1f} |"
        )
    return head + "\n".join(lines) + "\n"


def slowdown_label(x: float) -> str:
    return f"{100 * x:.0f} %"


def compact_table(rows: list[Summary]) -> str:
    """Every workload, size, slowdown and policy in one table."""
    out = (
        "| workload | nodes | spanning slowdown | policy | avg JCT (s) | p95 queue (s) | p95 queue 2-8 GPUs (s) | GPU util "
        "| multi-node gangs in one leaf | min team guarantee honoured | preemptions | GPU-h lost |\n"
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    for s in rows:
        out += (
            f"| {s.workload} | {s.nodes} | {slowdown_label(s.slowdown)} | {label(s)} | {_s(s.jct_mean)} | {_s(s.queue.p95)} "
            f"| {_s(s.queue_by_gang['2-8'].p95)} | {_pct(s.utilisation)} "
            f"| {_pct(s.multinode_one_leaf)} | {_pct(s.min_honoured)} | {s.preemptions:,} | {s.lost_gpu_h:,.0f} |\n"
        )
    return out


# (name, how to read it off a Summary, higher is better)
TARGETS: tuple[tuple[str, Callable[[Summary], float], bool], ...] = (
    ("avg JCT (s)", lambda s: s.jct_mean, False),
    ("p95 queue (s)", lambda s: s.queue.p95, False),
    ("p95 queue 1 GPU (s)", lambda s: s.queue_by_gang["1"].p95, False),
    ("p95 queue 2-8 GPUs (s)", lambda s: s.queue_by_gang["2-8"].p95, False),
    ("p95 queue >8 GPUs (s)", lambda s: s.queue_by_gang[">8"].p95, False),
    ("GPU util", lambda s: s.utilisation, True),
    ("gangs in one leaf", lambda s: s.multinode_one_leaf, True),
    ("min guarantee", lambda s: s.min_honoured, True),
)


def _versus(ym: float, best: float, higher: bool, name: str) -> str:
    """Yardmaster against the best baseline on one metric: the value and the gap, signed so that + is better."""
    if math.isnan(ym):
        return "–"
    if name in SHARES:
        gap = 100 * (ym - best)
        return f"{100 * ym:.1f} % ({gap:+.1f} pts)" if not math.isnan(best) else f"{100 * ym:.1f} %"
    if math.isnan(best) or best == 0:
        return _s(ym)
    rel = 100 * (best - ym) / best
    return f"{_s(ym)} ({rel:+.1f} %)"


def _against_best(
    rows: list[Summary], policy: str, cell: Callable[[Summary, str, float, float, str, bool], str], missing: str
) -> str:
    """A table with a row per (workload, size, slowdown, limits) of ``policy`` and a column per metric of
    TARGETS: ``cell(ym, name, value, best, who, higher)`` against the best baseline on that metric (``missing``
    where no baseline has it)."""
    from scheduling.sim.policies import BASELINES

    heads = " | ".join(name for name, _, _ in TARGETS)
    out = f"| workload | nodes | slowdown | limits | {heads} |\n|---|---:|---:|---|" + "---|" * len(TARGETS) + "\n"
    for ym in rows:
        if ym.policy != policy:
            continue
        peers = [
            s
            for s in rows
            if s.policy in BASELINES
            and (s.workload, s.nodes, s.slowdown) == (ym.workload, ym.nodes, ym.slowdown)
            and s.time_limits in ("-", ym.time_limits)
        ]
        cells = []
        for name, get, higher in TARGETS:
            values = [(get(s), s.policy) for s in peers if not math.isnan(get(s))]
            if not values:
                cells.append(missing if missing else _versus(get(ym), math.nan, higher, name))
                continue
            best, who = max(values) if higher else min(values)
            cells.append(cell(ym, name, get(ym), best, who, higher))
        out += f"| {ym.workload} | {ym.nodes} | {slowdown_label(ym.slowdown)} | {ym.time_limits} | " + " | ".join(cells) + " |\n"
    return out


def targets_table(rows: list[Summary], policy: str = "yardmaster") -> str:
    """Per (workload, size, slowdown, limits): ``policy`` and, beside each metric, how far it is ahead (+) of
    the best baseline on that metric (the strongest one for each claim), and that baseline."""

    def cell(ym: Summary, name: str, value: float, best: float, who: str, higher: bool) -> str:
        if name == "gangs in one leaf":
            return f"{_pct(value)} (best {who} {_pct(best)})"
        if name == "min guarantee":
            return f"{_pct(value)} ({who} {_pct(best)})"
        return f"{_versus(value, best, higher, name)} vs {who}"

    return _against_best(rows, policy, cell, missing="")


# Issue 30's bar: a time within 1 % of the best baseline's, or a share within 0.5 points, is a tie.
TIE_REL, TIE_PTS = 0.01, 0.005


def verdict(ym: float, best: float, higher: bool, name: str) -> str:
    """ "ahead", "tie" (within issue 30's margin) or "behind" of Yardmaster against the best baseline."""
    if math.isnan(ym) or math.isnan(best):
        return "–"
    gain = (ym - best) if higher else (best - ym)  # > 0: Yardmaster better
    if name in SHARES:
        margin = TIE_PTS
    else:
        margin = TIE_REL * abs(best)
    if abs(gain) <= margin:
        return "tie"
    return "ahead" if gain > 0 else "behind"


SHARES = ("GPU util", "gangs in one leaf", "min guarantee")


def verdicts_table(rows: list[Summary], policy: str = "yardmaster") -> str:
    """Per (workload, size, slowdown, limits) and metric: Yardmaster ahead of, tied with (within 1 %, or 0.5
    points for a share) or behind the best baseline on it, with that baseline's name when behind: the
    table to hold two workloads' verdicts side by side."""

    def cell(ym: Summary, name: str, value: float, best: float, who: str, higher: bool) -> str:
        v = verdict(value, best, higher, name)
        return f"behind {who}" if v == "behind" else v

    return _against_best(rows, policy, cell, missing="–")


def gang_table(rows: list[Summary]) -> str:
    cols = " | ".join(f"{b} GPUs avg / median / p95 (s)" for b, _, _ in GANG_BUCKETS)
    out = f"| policy | {cols} |\n|---|" + "---:|" * len(GANG_BUCKETS) + "\n"
    for s in rows:
        cells = " | ".join(f"{_s(d.mean)} / {_s(d.median)} / {_s(d.p95)} (n={d.count:,})" for d in s.queue_by_gang.values())
        out += f"| {label(s)} | {cells} |\n"
    return out


def team_table(rows: list[Summary]) -> str:
    """Per team: GPU-h used while it had demand over guarantee x demand time; share of guarantee honoured."""
    teams = sorted({t.team for s in rows for t in s.teams})
    out = "| team | guarantee (GPUs) | " + " | ".join(label(s) for s in rows) + " |\n"
    out += "|---|---:|" + "---:|" * len(rows) + "\n"
    for team in teams:
        g = next((t.guarantee for s in rows for t in s.teams if t.team == team), 0)
        cells = []
        for s in rows:
            t = next((t for t in s.teams if t.team == team), None)
            cells.append("–" if t is None else f"{_pct(t.share_of_guarantee)} / {_pct(t.honoured)}")
        out += f"| {team} | {g} | " + " | ".join(cells) + " |\n"
    return out


def extra_lines(rows: list[Summary]) -> str:
    out = []
    for s in rows:
        bits = [f"cycles {s.cycles:,}", f"time in policy {s.plan_s:.1f} s", f"replay CPU {s.cpu_s:.1f} s"]
        if not math.isnan(s.slowed):
            bits.append(f"multi-node placements slowed {_pct(s.slowed)} ({s.slow_gpu_h:,.0f} GPU-h of extra run time)")
        if s.at_risk_starts:
            bits.append(f"starts at risk {s.at_risk_starts:,}")
        bits += [f"{k.replace('_', ' ')} {v:,.0f}" for k, v in s.extra.items()]
        if s.unfinished:
            bits.append(f"**{s.unfinished} jobs never finished**")
        out.append(f"- {label(s)}: " + ", ".join(bits))
    return "\n".join(out) + "\n"
