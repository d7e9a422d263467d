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
   A gang of G GPUs is drawn with weight G ** ``gang_size_bias``: 0 (the default) draws the Philly gangs
   uniformly (87 % are 16-GPU), 2 draws 32- and 48-GPU gangs about 3x and 7x as often as before. The
   gang pool's mean is taken under the same weights, so ``gang_share`` still holds.
3. Submissions come in bursts (a sweep, a job array: several jobs submitted in the same second) whose
   sizes are geometric with mean ``burst`` (1, the default: every job alone, a Poisson process). Bursts
   are a Poisson process whose rate offers ``load`` of the cluster's GPU-time on average:
   rate = load x GPUs / (burst x E[GPU-seconds per job]). So ``jobs`` and ``load`` fix the trace's length.

``MIXES`` names the workloads the evaluation replays: ``gang-heavy`` (the first, seed 15) and
``gang-heavy-b``, another seed and another mix (more of the GPU-time in gangs, larger gangs, bursty
arrivals), so that a verdict that holds on one and not the other shows it was tuned to one draw.

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
from itertools import accumulate
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
    gang_size_bias: float = 0.0  # a gang of G GPUs is drawn with weight G ** bias (0: uniformly)
    burst: float = 1.0  # mean jobs per submission burst (geometric sizes; 1: every job alone)

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
    if params.burst < 1:
        raise ValueError(f"burst is a mean number of jobs per burst, at least 1, not {params.burst}")
    e_small = statistics.fmean(j.num_gpus * j.duration_s for j in small)
    bias = params.gang_size_bias
    weights = [float(j.num_gpus) ** bias for j in gangs]
    e_gang = sum(w * j.num_gpus * j.duration_s for w, j in zip(weights, gangs, strict=True)) / sum(weights)
    s = params.gang_share
    p = s * e_small / (s * e_small + (1 - s) * e_gang)
    mean_gpu_s = p * e_gang + (1 - p) * e_small
    rate = params.load * params.gpus / (params.burst * mean_gpu_s)  # bursts per second
    cum = list(accumulate(weights))
    rng = random.Random(params.seed)
    out: list[TraceJob] = []
    t = 0.0
    width = len(str(params.jobs))
    left = 0  # jobs still to come in the current burst
    for i in range(params.jobs):
        # With the defaults (no bias, no bursts) the draws are exactly those of the first version, so the
        # evaluation's first workload is the same jobs as before these parameters existed.
        if left == 0:
            t += rng.expovariate(rate)
            left = 1
            if params.burst > 1:
                while rng.random() >= 1.0 / params.burst:
                    left += 1
        left -= 1
        if rng.random() < p:
            drawn = gangs[rng.randrange(len(gangs))] if bias == 0 else rng.choices(gangs, cum_weights=cum)[0]
        else:
            drawn = small[rng.randrange(len(small))]
        out.append(replace(drawn, job_id=f"gh-{i:0{width}d}", submit_time=float(round(t))))
    out.sort(key=lambda j: (j.submit_time, j.job_id))
    return out


# The gang-heavy workloads the evaluation replays, by the name its tables give them.
MIXES: dict[str, GangHeavy] = {
    "gang-heavy": GangHeavy(),
    "gang-heavy-b": GangHeavy(seed=30, gang_share=0.75, gang_size_bias=2.0, burst=4.0),
}


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
    p.add_argument("--gang-size-bias", type=float, default=d.gang_size_bias, help="a gang of G GPUs is drawn with weight G**bias")
    p.add_argument("--burst", type=float, default=d.burst, help="mean jobs submitted together (1: each alone)")
    p.add_argument("--out", type=Path, required=True, help="CSV file to write")
    a = p.parse_args(argv)
    params = GangHeavy(
        seed=a.seed,
        jobs=a.jobs,
        gang_share=a.gang_share,
        load=a.load,
        nodes=a.nodes,
        gang_size_bias=a.gang_size_bias,
        burst=a.burst,
    )
    jobs = gang_heavy(params)
    write_csv(jobs, a.out)
    days = jobs[-1].submit_time / 86400 if jobs else 0.0
    print(
        f"{len(jobs)} jobs over {days:.1f} days; gangs hold {100 * gang_gpu_share(jobs, params.gpus_per_node):.1f} % of GPU-time"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
