"""A gang-heavy workload drawn from the Philly job mix, seeded, for the evaluation.

The production trace the project keeps back (about 11,000 jobs on 100 x 8-GPU nodes, multi-node gangs
holding most of the GPU-time) cannot be shipped, and in the Philly month multi-node gangs hold only 7 %
of the GPU-time. This generator keeps Philly's jobs as they are (GPU count, run time, status, team and
user travel together, so per-user time limits and per-team quotas work as on Philly) and changes only
how often each kind is drawn:

1. The Philly jobs are split into *single-node* jobs (at most one node's GPUs) and *multi-node gangs*;
   run times are capped at ``max_duration_s`` (3 days: the month's multi-week jobs would otherwise
   dominate a month-long replay on 100 nodes and never drain).
2. Each generated job is a gang with probability ``p``, else a single-node job, and is a uniform draw
   (with replacement) from its pool. ``p`` is set from the pools' mean GPU-seconds so that gangs are
   expected to hold ``gang_share`` of the GPU-time: p = s E_small / (s E_small + (1 - s) E_gang).
3. Submissions are a Poisson process whose rate offers ``load`` of the cluster's GPU-time on average:
   rate = load x GPUs / E[GPU-seconds per job]. So ``jobs`` and ``load`` fix the trace's length.

Everything comes from one ``random.Random(seed)``: the same arguments give the same jobs, on every
machine and Python version (``random``'s generator and its ``random()``/``expovariate`` are stable).
``python -m scheduling.sim.workload --out FILE.csv`` writes it in the trace format ``trace.load_trace``
reads.
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from scheduling.sim.trace import TraceJob, load_trace

PHILLY = Path(__file__).parent / "data" / "philly_sep2017.csv"


@dataclass(frozen=True, slots=True)
class GangHeavy:
    """The generator's parameters; the defaults are the evaluation's workload."""

    seed: int = 15
    jobs: int = 11_000
    gang_share: float = 0.65  # expected share of GPU-time held by multi-node gangs
    load: float = 0.85  # offered GPU-time over the cluster's capacity
    nodes: int = 100
    gpus_per_node: int = 8
    nodes_per_leaf: int = 25  # 4 leaves of 25 nodes under one spine
    max_duration_s: float = 3 * 86400.0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def gang_heavy(params: GangHeavy = GangHeavy(), source: list[TraceJob] | None = None) -> list[TraceJob]:
    """The generated jobs, in submit order (see the module docstring for how they are drawn)."""
    philly = source if source is not None else load_trace(PHILLY)
    cap = params.max_duration_s
    pool = [replace(j, duration_s=min(j.duration_s, cap)) for j in philly if j.duration_s > 0]
    small = [j for j in pool if j.num_gpus <= params.gpus_per_node]
    gangs = [j for j in pool if j.num_gpus > params.gpus_per_node]
    if not small or not gangs:
        raise ValueError("the source trace needs both single-node jobs and multi-node gangs")
    e_small = statistics.fmean(j.num_gpus * j.duration_s for j in small)
    e_gang = statistics.fmean(j.num_gpus * j.duration_s for j in gangs)
    s = params.gang_share
    p = s * e_small / (s * e_small + (1 - s) * e_gang)
    mean_gpu_s = p * e_gang + (1 - p) * e_small
    rate = params.load * params.gpus / mean_gpu_s  # jobs per second
    rng = random.Random(params.seed)
    out: list[TraceJob] = []
    t = 0.0
    width = len(str(params.jobs))
    for i in range(params.jobs):
        t += rng.expovariate(rate)
        drawn = gangs[rng.randrange(len(gangs))] if rng.random() < p else small[rng.randrange(len(small))]
        out.append(replace(drawn, job_id=f"gh-{i:0{width}d}", submit_time=float(round(t))))
    out.sort(key=lambda j: (j.submit_time, j.job_id))
    return out


def gang_gpu_share(jobs: list[TraceJob], gpus_per_node: int) -> float:
    """Share of the GPU-time (GPUs x run time) held by jobs larger than one node."""
    total = sum(j.num_gpus * j.duration_s for j in jobs)
    return sum(j.num_gpus * j.duration_s for j in jobs if j.num_gpus > gpus_per_node) / total if total else 0.0


def write_csv(jobs: list[TraceJob], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["job_id", "submit_time", "duration_s", "num_gpus", "num_nodes", "team", "user", "status", "gpu_type"])
        for j in jobs:
            w.writerow([j.job_id, int(j.submit_time), int(j.duration_s), j.num_gpus, "", j.team, j.user, j.status, j.gpu_type])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scheduling.sim.workload", description=__doc__.split("\n\n")[0])
    d = GangHeavy()
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--jobs", type=int, default=d.jobs)
    p.add_argument("--gang-share", type=float, default=d.gang_share)
    p.add_argument("--load", type=float, default=d.load)
    p.add_argument("--nodes", type=int, default=d.nodes)
    p.add_argument("--out", type=Path, required=True, help="CSV file to write")
    a = p.parse_args(argv)
    params = GangHeavy(seed=a.seed, jobs=a.jobs, gang_share=a.gang_share, load=a.load, nodes=a.nodes)
    jobs = gang_heavy(params)
    write_csv(jobs, a.out)
    days = jobs[-1].submit_time / 86400 if jobs else 0.0
    print(
        f"{len(jobs)} jobs over {days:.1f} days; gangs hold {100 * gang_gpu_share(jobs, params.gpus_per_node):.1f} % of GPU-time"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
