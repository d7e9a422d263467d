"""``python -m scheduling.sim``: replay a trace under several policies, cluster sizes and topology costs.

Each (workload, policy, size, time-limit mode, spanning slowdown) replay is independent and runs in
its own process (``--jobs``); the tables are printed as markdown and, with ``--out``, written to
``results.md`` there beside the PNG plots. The workloads are the trace (``--trace``, default the
Philly month, at each of ``--nodes``) and the seeded gang-heavy workloads drawn from it
(``workload.MIXES``, those named by ``--gang-heavy``, at ``--gang-heavy-nodes``; 0 leaves them out).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from scheduling.core.types import Config, LeafLocality
from scheduling.sim.cluster import ClusterShape, read_team_weights
from scheduling.sim.engine import Replay
from scheduling.sim.metrics import (
    Summary,
    compact_table,
    extra_lines,
    gang_table,
    headline_table,
    slowdown_label,
    summarise,
    targets_table,
    team_table,
    verdicts_table,
)
from scheduling.sim.policies import KNOWN, LIMIT_BLIND, NAMES, RENAMED, make_policy
from scheduling.sim.replay_types import DEPLOYMENT_CYCLE_S, ReplayConfig
from scheduling.sim.trace import TraceJob, load_trace, time_limits
from scheduling.sim.workload import MIXES, GangHeavy, gang_heavy

DATA = Path(__file__).parent / "data"
DEFAULT_TRACE = DATA / "philly_sep2017.csv"
DEFAULT_QUOTAS = DATA / "philly_quotas.csv"
GANG_HEAVY = "gang-heavy"  # the first of workload.MIXES


def _parse_types(text: str) -> tuple[tuple[str, int], ...]:
    """``"P40"`` (the whole cluster) or ``"P40=160,P100=96"`` (node counts, in node order)."""
    if "=" not in text:
        return ()
    out = []
    for part in text.split(","):
        name, _, count = part.partition("=")
        out.append((name.strip(), int(count)))
    return tuple(out)


def _slowdowns(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give factors as a comma list, e.g. 0,0.1,0.25") from None
    if not values or any(not 0 <= v < 10 for v in values):
        raise argparse.ArgumentTypeError(f"{text!r}: each factor between 0 and 10 (0.25 = 25 % slower)")
    return values


def _mixes(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MIXES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {', '.join(MIXES)}")
    return names


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scheduling.sim", description=__doc__)
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace CSV (default: bundled Philly month)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N jobs of each workload")
    p.add_argument("--nodes", type=int, nargs="+", default=[256], help="cluster sizes in nodes for the trace; 0: skip it")
    p.add_argument(
        "--gang-heavy-nodes", type=int, default=GangHeavy().nodes, help="nodes for the gang-heavy workload; 0: skip it"
    )
    p.add_argument(
        "--gang-heavy",
        type=_mixes,
        default=list(MIXES),
        help=f"comma list of the gang-heavy workloads to replay (workload.MIXES: {', '.join(MIXES)})",
    )
    p.add_argument("--gang-heavy-seed", type=int, default=GangHeavy().seed, help=f"seed of {GANG_HEAVY}")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes-per-leaf", type=int, default=32, help="for the trace (the gang-heavy cluster has its own)")
    p.add_argument("--leaves-per-spine", type=int, default=4)
    p.add_argument("--gpu-types", default="P40", help='"P40", or node counts per type: "P40=160,P100=96"')
    p.add_argument("--quotas", type=Path, default=DEFAULT_QUOTAS, help="team,size CSV; scaled to the cluster")
    p.add_argument("--policies", default=",".join(NAMES), help=f"comma list of {', '.join(KNOWN)}")
    p.add_argument("--time-limits", choices=("oracle", "estimate", "both"), default="both")
    p.add_argument(
        "--slowdowns",
        type=_slowdowns,
        default=[0.0, 0.1, 0.25],
        help="what spanning leaves costs, comma list of factors (0.25: a spanning gang runs 25 %% longer); each is a replay",
    )
    p.add_argument(
        "--trace-slowdowns",
        type=_slowdowns,
        default=None,
        help="the trace's own slowdowns, where they differ from --slowdowns (which then serve the gang-heavy "
        "workloads alone); make eval replays the Philly month at 0 and 25 %% only, to finish in 5 minutes",
    )
    p.add_argument(
        "--believed-slowdown",
        type=float,
        default=None,
        help="Yardmaster's Config.span_slowdown (default: the replay's own factor, as a deployment that measured it)",
    )
    p.add_argument(
        "--cycle-s",
        type=float,
        default=DEPLOYMENT_CYCLE_S,
        help=f"scheduling cycle interval (simulated s; default {DEPLOYMENT_CYCLE_S:g}, the deployment's); 0: a cycle at "
        "every arrival and departure (event-driven)",
    )
    p.add_argument("--wake-s", type=float, default=600.0, help="cycle at least this often while jobs wait")
    p.add_argument("--checkpoint-s", type=float, default=3600.0, help="checkpoint interval; 0: never")
    p.add_argument(
        "--busy-from",
        type=float,
        default=None,
        help="metrics window start for the trace (s); default: day 20 of the bundled Philly month (its README's "
        "steady state), 0 (the whole trace) for any other --trace",
    )
    p.add_argument("--grace-s", type=float, default=Config().grace_period_s)
    p.add_argument(
        "--at-risk",
        action="store_true",
        help="Yardmaster with backfill at risk (Config.backfill_at_risk): off in the deployment, so off by default",
    )
    p.add_argument(
        "--leaf-locality",
        choices=[m.value for m in LeafLocality],
        default=LeafLocality.AUTO.value,
        help="what every gang asks of a leaf switch (a job's leaf_locality)",
    )
    p.add_argument("--jobs", type=int, default=2, help="replays run in parallel")
    p.add_argument("--out", type=Path, default=None, help="write results.md and PNG plots here")
    return p


@dataclass(frozen=True, slots=True)
class Task:
    workload: str
    policy: str
    nodes: int
    mode: str  # oracle | estimate | "-" (limit-blind policy)
    slowdown: float
    args: argparse.Namespace


_trace_cache: dict[tuple[str, str, int | None, int], list[TraceJob]] = {}


def _jobs(workload: str, args: argparse.Namespace) -> list[TraceJob]:
    key = (workload, str(args.trace), args.limit, args.gang_heavy_seed)
    if key not in _trace_cache:
        if workload in MIXES:
            mix = MIXES[workload]
            seed = args.gang_heavy_seed if workload == GANG_HEAVY else mix.seed
            jobs = gang_heavy(replace(mix, seed=seed, nodes=args.gang_heavy_nodes))
            _trace_cache[key] = jobs[: args.limit] if args.limit is not None else jobs
        else:
            _trace_cache[key] = load_trace(args.trace, limit=args.limit)
    return _trace_cache[key]


def _shape(task: Task) -> ClusterShape:
    args = task.args
    if task.workload in MIXES:
        g = MIXES[task.workload]
        return ClusterShape(nodes=task.nodes, gpus_per_node=g.gpus_per_node, nodes_per_leaf=g.nodes_per_leaf, leaves_per_spine=4)
    types = _parse_types(args.gpu_types)
    return ClusterShape(
        nodes=task.nodes,
        gpus_per_node=args.gpus_per_node,
        nodes_per_leaf=args.nodes_per_leaf,
        leaves_per_spine=args.leaves_per_spine,
        gpu_types=types or ((args.gpu_types, task.nodes),),
    )


def trace_label(args: argparse.Namespace) -> str:
    """The name the tables give the trace: "philly" for the bundled month, else the file's own name."""
    return "philly" if args.trace.resolve() == DEFAULT_TRACE.resolve() else args.trace.stem


def busy_from(args: argparse.Namespace) -> float:
    if args.busy_from is not None:
        return float(args.busy_from)
    return 20 * 86400.0 if trace_label(args) == "philly" else 0.0


def replay_config(task: Task) -> ReplayConfig:
    args = task.args
    believed = task.slowdown if args.believed_slowdown is None else args.believed_slowdown
    return ReplayConfig(
        cycle_s=args.cycle_s,
        wake_s=args.wake_s,
        checkpoint_s=args.checkpoint_s,
        # The gang-heavy workload starts at 0 with no history to skip: its window is the whole trace.
        busy_from=0.0 if task.workload in MIXES else busy_from(args),
        span_slowdown=task.slowdown,
        leaf_locality=LeafLocality(args.leaf_locality),
        # The deployment's Config but for what the replay measures: backfill at risk stays off as the
        # portal's scheduler_config() leaves it (it was on here, alone: 90 % of the replay's preemptions).
        # The replay keeps Placement.at_risk across cycles (as RunningJob.at_risk), so --at-risk can lend at risk.
        core=replace(Config(), grace_period_s=args.grace_s, span_slowdown=believed, backfill_at_risk=args.at_risk),
    )


def _replay(task: Task) -> Summary:
    cpu0 = time.process_time()
    jobs = _jobs(task.workload, task.args)
    result = Replay(
        jobs,
        make_policy(task.policy),
        shape=_shape(task),
        limits=time_limits(jobs, "oracle" if task.mode == "-" else task.mode),
        team_weights=read_team_weights(task.args.quotas),
        config=replay_config(task),
        name=task.policy,
    ).run()
    summary = summarise(result, time_limits=task.mode, workload=task.workload, slowdown=task.slowdown)
    summary.cpu_s = time.process_time() - cpu0
    print(
        f"  done: {task.workload} {task.policy} {task.mode} {task.nodes} nodes, slowdown {slowdown_label(task.slowdown)} "
        f"in {summary.wall_s:.1f} s ({summary.cpu_s:.1f} s CPU)",
        file=sys.stderr,
        flush=True,
    )
    return summary


def tasks(args: argparse.Namespace) -> list[Task]:
    modes = ["oracle", "estimate"] if args.time_limits == "both" else [args.time_limits]
    sizes = [(trace_label(args), n) for n in args.nodes if n > 0]
    if args.gang_heavy_nodes > 0:
        sizes.extend((name, args.gang_heavy_nodes) for name in args.gang_heavy)
    out = []
    for workload, nodes in sizes:
        trace_own = workload not in MIXES and args.trace_slowdowns is not None
        for slowdown in args.trace_slowdowns if trace_own else args.slowdowns:
            for policy in args.policies.split(","):
                for mode in ["-"] if policy in LIMIT_BLIND else modes:
                    out.append(Task(workload, policy, nodes, mode, slowdown, args))
    # Longest first so that the workers finish together: Yardmaster's replays, the oversubscribed sizes.
    return sorted(out, key=lambda t: (not t.policy.startswith("yardmaster"), t.workload in MIXES, t.nodes))


def report(rows: list[Summary], command: str, wall_s: float, load: str = "") -> str:
    cpu = sum(s.cpu_s for s in rows)
    parts = [
        f"Command: `{command}`\n\nWall time of the whole run: {wall_s:.0f} s; CPU time of its {len(rows)} replays: "
        f"{cpu:.0f} s{load}.\n\n"
        "Yardmaster against the best baseline on each metric (in brackets: how far ahead, + is better; "
        f"the baseline named is the best on that metric):\n\n{targets_table(rows)}\n"
        "The verdicts: Yardmaster ahead of the best baseline on each metric, tied with it (within 1 %, or 0.5 "
        f"points for a share) or behind it:\n\n{verdicts_table(rows)}\n"
        f"Every replay:\n\n{compact_table(rows)}"
    ]
    groups = sorted({(s.workload, s.nodes, s.slowdown) for s in rows}, key=lambda g: (g[0] in MIXES, g[0], -g[1], g[2]))
    for workload, nodes, slowdown in groups:
        group = [s for s in rows if (s.workload, s.nodes, s.slowdown) == (workload, nodes, slowdown)]
        parts.append(f"\n## {workload}, {nodes} nodes, spanning slowdown {slowdown_label(slowdown)}\n\n{headline_table(group)}")
        parts.append(f"\nQueueing delay by gang size:\n\n{gang_table(group)}")
        parts.append(
            "\nPer team, while it had demand: GPU-h used / (guarantee x hours with demand), "
            f"then share of its guarantee honoured:\n\n{team_table(group)}"
        )
        parts.append(f"\n{extra_lines(group)}")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    for name in args.policies.split(","):
        if name in RENAMED:
            parser().error(RENAMED[name])
        if name not in KNOWN:
            parser().error(f"unknown policy {name!r}; choose from {', '.join(KNOWN)}")
    work = tasks(args)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    if args.jobs > 1 and len(work) > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.map(_replay, work, chunksize=1)
    else:
        rows = [_replay(t) for t in work]
    wall = time.perf_counter() - t0
    order = {name: i for i, name in enumerate(KNOWN)}
    rows.sort(key=lambda s: (s.workload in MIXES, s.workload, -s.nodes, s.slowdown, order[s.policy], s.time_limits))
    command = "python -m scheduling.sim " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    # The machine's 1-minute load average as the run began and ended: a wall time means little without it.
    load = f" on {args.jobs} processes; load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    text = report(rows, command, wall, load)
    print(text)
    if args.out is not None:
        from scheduling.sim.plots import write_plots

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(text)
        for path in write_plots(rows, args.out, busy_from=busy_from(args)):
            print(f"wrote {path}", file=sys.stderr)
    return 0
