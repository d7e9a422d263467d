"""``python -m scheduling.sim``: replay a trace under several policies and cluster sizes.

Each (policy, size, time-limit mode) replay is independent and runs in its own
process (``--jobs``); the tables are printed as markdown and, with ``--out``,
written to ``results.md`` there beside the PNG plots.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

from scheduling.core.types import Config
from scheduling.sim.cluster import ClusterShape, read_team_weights
from scheduling.sim.engine import Replay, ReplayConfig
from scheduling.sim.metrics import Summary, compact_table, extra_lines, gang_table, headline_table, summarise, team_table
from scheduling.sim.policies import LIMIT_BLIND, NAMES, make_policy
from scheduling.sim.trace import TraceJob, load_trace, time_limits

DATA = Path(__file__).parent / "data"
DEFAULT_TRACE = DATA / "philly_sep2017.csv"
DEFAULT_QUOTAS = DATA / "philly_quotas.csv"


def _parse_types(text: str) -> tuple[tuple[str, int], ...]:
    """``"P40"`` (the whole cluster) or ``"P40=160,P100=96"`` (node counts, in node order)."""
    if "=" not in text:
        return ()
    out = []
    for part in text.split(","):
        name, _, count = part.partition("=")
        out.append((name.strip(), int(count)))
    return tuple(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scheduling.sim", description=__doc__)
    p.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace CSV (default: bundled Philly month)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N jobs")
    p.add_argument("--nodes", type=int, nargs="+", default=[256], help="cluster sizes in nodes")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--nodes-per-leaf", type=int, default=32)
    p.add_argument("--leaves-per-spine", type=int, default=4)
    p.add_argument("--gpu-types", default="P40", help='"P40", or node counts per type: "P40=160,P100=96"')
    p.add_argument("--quotas", type=Path, default=DEFAULT_QUOTAS, help="team,size CSV; scaled to the cluster")
    p.add_argument("--policies", default=",".join(NAMES), help=f"comma list of {', '.join(NAMES)}")
    p.add_argument("--time-limits", choices=("oracle", "estimate", "both"), default="both")
    p.add_argument("--cycle-s", type=float, default=60.0, help="scheduling cycle interval (simulated s)")
    p.add_argument("--wake-s", type=float, default=600.0, help="cycle at least this often while jobs wait")
    p.add_argument("--checkpoint-s", type=float, default=3600.0, help="checkpoint interval; 0: never")
    p.add_argument("--busy-from", type=float, default=20 * 86400.0, help="metrics window start (trace s)")
    p.add_argument("--grace-s", type=float, default=Config().grace_period_s)
    p.add_argument("--jobs", type=int, default=2, help="replays run in parallel")
    p.add_argument("--out", type=Path, default=None, help="write results.md and PNG plots here")
    return p


_trace_cache: dict[tuple[str, int | None], list[TraceJob]] = {}


def _replay(task: tuple[str, int, str, argparse.Namespace]) -> Summary:
    policy, nodes, mode, args = task
    key = (str(args.trace), args.limit)
    if key not in _trace_cache:
        _trace_cache[key] = load_trace(args.trace, limit=args.limit)
    jobs = _trace_cache[key]
    types = _parse_types(args.gpu_types)
    shape = ClusterShape(
        nodes=nodes,
        gpus_per_node=args.gpus_per_node,
        nodes_per_leaf=args.nodes_per_leaf,
        leaves_per_spine=args.leaves_per_spine,
        gpu_types=types or ((args.gpu_types, nodes),),
    )
    cfg = ReplayConfig(
        cycle_s=args.cycle_s,
        wake_s=args.wake_s,
        checkpoint_s=args.checkpoint_s,
        busy_from=args.busy_from,
        core=replace(Config(), grace_period_s=args.grace_s),
    )
    result = Replay(
        jobs,
        make_policy(policy),
        shape=shape,
        limits=time_limits(jobs, "oracle" if mode == "-" else mode),
        team_weights=read_team_weights(args.quotas),
        config=cfg,
        name=policy,
    ).run()
    summary = summarise(result, time_limits=mode)
    print(f"  done: {policy} {mode} {nodes} nodes in {summary.wall_s:.1f} s", file=sys.stderr, flush=True)
    return summary


def tasks(args: argparse.Namespace) -> list[tuple[str, int, str, argparse.Namespace]]:
    modes = ["oracle", "estimate"] if args.time_limits == "both" else [args.time_limits]
    out = []
    for nodes in args.nodes:
        for policy in args.policies.split(","):
            for mode in ["-"] if policy in LIMIT_BLIND else modes:
                out.append((policy, nodes, mode, args))
    # Longest first so that the two workers finish together.
    return sorted(out, key=lambda t: (t[0] != "yardmaster", -t[1]))


def report(rows: list[Summary], command: str, wall_s: float) -> str:
    parts = [f"Command: `{command}`\n\nWall time of the whole run: {wall_s:.0f} s.\n\n{compact_table(rows)}"]
    for nodes in sorted({s.nodes for s in rows}, reverse=True):
        group = [s for s in rows if s.nodes == nodes]
        parts.append(f"\n## {nodes} nodes\n\n{headline_table(group)}")
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
        if name not in NAMES:
            parser().error(f"unknown policy {name!r}")
    work = tasks(args)
    t0 = time.perf_counter()
    if args.jobs > 1 and len(work) > 1:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            rows = pool.map(_replay, work, chunksize=1)
    else:
        rows = [_replay(t) for t in work]
    wall = time.perf_counter() - t0
    order = {name: i for i, name in enumerate(NAMES)}
    rows.sort(key=lambda s: (-s.nodes, order[s.policy], s.time_limits))
    command = "python -m scheduling.sim " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    text = report(rows, command, wall)
    print(text)
    if args.out is not None:
        from scheduling.sim.plots import write_plots

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.md").write_text(text)
        for path in write_plots(rows, args.out, busy_from=args.busy_from):
            print(f"wrote {path}", file=sys.stderr)
    return 0
