"""Reading a job trace (the CSV format of /work/shared/traces, one job per row).

A trace row knows a job's GPU count, not its gang shape, and its true run time,
not the time limit a user would have typed. Both are derived here, in one place,
so every policy sees the same jobs.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# Round limits a user picks from (Slurm users type "4:00:00", "1-00:00:00", ...).
_LIMIT_LADDER_S = tuple(h * 3600 for h in (1, 2, 4, 8, 12, 24, 48, 72, 7 * 24, 14 * 24, 30 * 24, 60 * 24, 90 * 24))


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_time: float
    duration_s: float  # seconds of work; a preempted job redoes what it lost
    num_gpus: int
    team: str
    user: str
    status: str  # completed | failed | killed
    gpu_type: str  # empty in the Philly trace: the cluster's default type is used


def load_trace(path: Path | str, *, limit: int | None = None) -> list[TraceJob]:
    """Jobs in submission order, ties broken by job id (the trace README's rule)."""
    jobs: list[TraceJob] = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            jobs.append(
                TraceJob(
                    job_id=row["job_id"],
                    submit_time=float(row["submit_time"]),
                    duration_s=float(row["duration_s"]),
                    num_gpus=int(row["num_gpus"]),
                    team=row["team"] or "unknown",
                    user=row["user"],
                    status=row["status"],
                    gpu_type=row.get("gpu_type", "") or "",
                )
            )
    jobs.sort(key=lambda j: (j.submit_time, j.job_id))
    return jobs[:limit] if limit is not None else jobs


def gang_shape(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(replicas, GPUs per replica) for a job of ``num_gpus`` GPUs.

    A job that fits one node is one replica. A larger one is split into the fewest
    equal replicas that each fit a node (28 GPUs on 8-GPU nodes -> 4 x 7), which is
    how torchrun jobs are launched: one process group per node, same size on each.
    """
    if num_gpus <= gpus_per_node:
        return 1, num_gpus
    replicas = -(-num_gpus // gpus_per_node)
    while num_gpus % replicas:
        replicas += 1
    return replicas, num_gpus // replicas


def round_up_limit(seconds: float) -> float:
    for step in _LIMIT_LADDER_S:
        if seconds <= step:
            return float(step)
    return float(_LIMIT_LADDER_S[-1])


def time_limits(jobs: list[TraceJob], mode: str) -> dict[str, float]:
    """Each job's time limit, the number backfill and reservations plan with.

    ``oracle``: the true duration (the best any backfill can do).
    ``estimate``: what a user could have typed: a round value from the ladder above
    the run time they expect. For a completed job that is its own duration; a job
    that later failed or was killed was submitted expecting a normal run, so its
    user asks for at least what their typical (median) completed job needed.
    The limit is never below the true duration, so no job is killed by its limit.
    """
    if mode == "oracle":
        return {j.job_id: max(j.duration_s, 1.0) for j in jobs}
    if mode != "estimate":
        raise ValueError(f"time-limit mode must be oracle or estimate, not {mode!r}")
    completed: dict[str, list[float]] = defaultdict(list)
    for j in jobs:
        if j.status == "completed":
            completed[j.user].append(j.duration_s)
    typical = {user: statistics.median(d) for user, d in completed.items()}
    limits = {}
    for j in jobs:
        expected = j.duration_s if j.status == "completed" else max(j.duration_s, typical.get(j.user, 0.0))
        limits[j.job_id] = max(round_up_limit(expected), j.duration_s, 1.0)
    return limits
