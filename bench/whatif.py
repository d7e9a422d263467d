"""How long a what-if replay of a month takes: 15,000 jobs on 192 nodes, once per tree (live and draft).

    python bench/whatif.py [--quick] [--jobs N] [--days D]

In-process, no database: the replay the what-if's Celery task runs (scheduling/whatif/replay.py's
``replay_tree``: the trace replay engine of scheduling/sim driving the real ``plan()``), on a synthetic
month shaped like the demo's history: 192 8-GPU nodes (160 H100, 32 A100) on 8 leaves of 24 nodes, a
tree of 2 business units over 8 teams with per-type guarantees and limits, 15,000 jobs of 1 to 32 GPUs
(1 x 1 up to 4 x 8) in the three tiers, arriving over 30 days at about 85 % of the fleet's GPU-hours.
The live tree, then a draft that moves 64 H100 of guarantee from one team to another (the issue's
question), each timed in wall seconds and CPU seconds of this process (the replay is single-threaded:
one of the machine's two cores). The deployment's settings are the defaults (a 5 s cycle interval).
Reading the month from PostgreSQL (two queries) is not part of it.

The what-if's target: at most 2 minutes per tree. The base commit has no what-if: its figures are None.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.benchlib import result, use_code

CODE = use_code()

OVER = "in-process replay_tree (scheduling.sim engine + core plan()), synthetic month, 192 nodes, no database"
TEAMS = [f"team-{i}" for i in range(8)]
SHAPES = (  # replicas, GPUs per replica, GPU type, mean hours, weight
    (1, 8, "H100", 6.0, 30),
    (2, 8, "H100", 8.0, 10),
    (4, 8, "H100", 12.0, 3),
    (1, 4, "H100", 3.0, 10),
    (1, 1, "H100", 2.0, 25),
    (1, 8, "A100", 5.0, 8),
    (1, 4, "A100", 3.0, 14),
)


def fleet():  # type: ignore[no-untyped-def]
    from scheduling.core.types import Gpu, Node, Topology

    nodes = []
    for i in range(192):
        name = f"node-{i:03d}"
        gpus = tuple(
            Gpu(id=f"{name}/{k}", index=k, nvlink=f"{name}/nvl", pcie=f"{name}/p{k // 4}", numa=f"{name}/n{k // 4}")
            for k in range(8)
        )
        nodes.append(
            Node(name=name, leaf=f"leaf-{i // 24}", spine=f"spine-{i // 96}", gpu_type="H100" if i < 160 else "A100", gpus=gpus)
        )
    return Topology(nodes=tuple(nodes))


def tree(moved: int):  # type: ignore[no-untyped-def]
    from scheduling.core.types import QuotaUnit

    units = [
        QuotaUnit("cluster", None, guaranteed={"H100": 1280, "A100": 256}),
        QuotaUnit("research", "cluster", guaranteed={"H100": 640, "A100": 128}),
        QuotaUnit("products", "cluster", guaranteed={"H100": 640, "A100": 128}),
    ]
    for i, team in enumerate(TEAMS):
        h100 = 160 + (moved if i == 0 else -moved if i == 1 else 0)
        units.append(
            QuotaUnit(team, "research" if i < 4 else "products", guaranteed={"H100": h100, "A100": 32}, limit={"H100": 640})
        )
    return tuple(units)


def month(jobs: int, days: float):  # type: ignore[no-untyped-def]
    from scheduling.whatif.replay import ReplayJob

    rng = random.Random(31)
    weights = [s[4] for s in SHAPES]
    out = []
    for k in range(jobs):
        replicas, per, gpu_type, hours, _ = rng.choices(SHAPES, weights)[0]
        run_s = rng.uniform(0.2, 1.8) * hours * 3600 * LOAD
        out.append(
            ReplayJob(
                job_id=str(k),
                team=TEAMS[min(int(rng.expovariate(0.35)), 7)],
                tier=rng.choices((1, 2, 3), (1, 7, 2))[0],
                gpu_type=gpu_type,
                replicas=replicas,
                gpus_per_replica=per,
                submit_s=rng.uniform(0, days * 86400),
                run_s=run_s,
                limit_s=run_s * rng.uniform(1.2, 3.0),
            )
        )
    return out


LOAD = 1.4  # scales run times so that the month asks ~85 % of the fleet's GPU-hours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3,000 jobs over 6 days")
    parser.add_argument("--jobs", type=int, default=15000)
    parser.add_argument("--days", type=float, default=30.0)
    opts = parser.parse_args()
    jobs, days = (3000, 6.0) if opts.quick else (opts.jobs, opts.days)
    # The editable install's finder would hand out this checkout's package for a module the measured
    # code lacks: ask the measured tree itself.
    if not (CODE / "scheduling" / "whatif" / "replay.py").exists():
        print(f"{CODE} has no what-if (scheduling/whatif): nothing to measure")
        for tree_name in ("live", "draft"):
            result(f"whatif.replay_wall_s.{tree_name}", None, "s", over=OVER)
            result(f"whatif.replay_cpu_s.{tree_name}", None, "s", over=OVER)
        return
    from scheduling.core.types import Config
    from scheduling.whatif.replay import replay_tree

    topology, trace = fleet(), month(jobs, days)
    asked = sum(j.gpus * j.run_s for j in trace) / (sum(len(n.gpus) for n in topology.nodes) * days * 86400)
    print(f"{len(trace):,} jobs over {days:g} days on {len(topology.nodes)} nodes; they ask {asked:.0%} of the fleet's GPU-hours")
    waits = {}
    for tree_name, moved in (("live", 0), ("draft", 64)):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        outcome = replay_tree(jobs=trace, fleet=topology, quotas=tree(moved), config=Config(), cycle_s=5.0)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        got = [o.wait_s for o in outcome.jobs.values() if o.wait_s is not None]
        waits[tree_name] = {
            team: sum(outcome.jobs[j.job_id].wait_s or 0.0 for j in trace if j.team == team)
            / 3600
            / max(1, sum(1 for j in trace if j.team == team))
            for team in TEAMS[:2]
        }
        print(
            f"{tree_name:5}: {wall:6.1f} s wall, {cpu:6.1f} s CPU, {outcome.cycles:,} cycles, "
            f"mean wait {sum(got) / max(len(got), 1) / 3600:.2f} h, {sum(o.preempted for o in outcome.jobs.values())} preemptions"
        )
        result(f"whatif.replay_wall_s.{tree_name}", round(wall, 2), "s", over=OVER)
        result(f"whatif.replay_cpu_s.{tree_name}", round(cpu, 2), "s", over=OVER)
    for team in TEAMS[:2]:
        print(f"  {team}: mean wait {waits['live'][team]:.2f} h live -> {waits['draft'][team]:.2f} h draft")
    print("target: at most 120 s per tree on 2 cores")


if __name__ == "__main__":
    main()
