"""CPU seconds of the trace replay's baseline policies (scheduling/sim), one replay each, as `make eval` runs them.

    python bench/sim_replay.py [--quick] [--policies fifo,first-fit,easy-blind,easy-topo] [--nodes 160]

Each replay of the Philly month (estimated limits, spanning slowdown 10 %, the deployment's 5 s cycle) runs
in this process, one after another, timed in CPU seconds of this process (a replay is single-threaded), so
other load on the machine moves the figures less than wall time would. --quick replays the first 8,000
jobs only. Yardmaster's replays are the core's plan() (97 % of them) and are not measured here.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result, use_code

CODE = use_code()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the first 8,000 jobs of the month")
    ap.add_argument("--policies", default="fifo,first-fit,easy-blind,easy-topo")
    ap.add_argument("--nodes", type=int, default=160)
    opts = ap.parse_args()
    from scheduling.sim import cli
    from scheduling.sim.cluster import read_team_weights
    from scheduling.sim.engine import Replay
    from scheduling.sim.policies import LIMIT_BLIND, make_policy
    from scheduling.sim.trace import time_limits

    argv = ["--nodes", str(opts.nodes), "--time-limits", "estimate", "--gang-heavy-nodes", "0"]
    args = cli.parser().parse_args([*argv, *(["--limit", "8000"] if opts.quick else [])])
    over = f"Philly {'first 8,000 jobs' if opts.quick else 'month'}, {opts.nodes} nodes, estimate, 10 %, 5 s cycle, in-process"
    total = 0.0
    for policy in opts.policies.split(","):
        task = cli.Task("philly", policy, opts.nodes, "-" if policy in LIMIT_BLIND else "estimate", 0.1, args)
        jobs = cli._jobs(task.workload, args)
        cpu0 = time.process_time()
        replay = Replay(
            jobs,
            make_policy(policy),
            shape=cli._shape(task),
            limits=time_limits(jobs, "oracle" if task.mode == "-" else task.mode),
            team_weights=read_team_weights(args.quotas),
            config=cli.replay_config(task),
            name=policy,
        ).run()
        cpu = time.process_time() - cpu0
        total += cpu
        print(f"{policy}: {cpu:.2f} s CPU, {replay.cycles} cycles, {len(replay.placements)} placements")
        result(f"sim_replay.{policy}_cpu_s", cpu, "s", over=over)
    result("sim_replay.baselines_cpu_s", total, "s", over=over)


if __name__ == "__main__":
    main()
