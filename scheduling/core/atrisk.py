"""EASY backfill at risk: reserved GPUs lent to preemptible work until the reservation comes due.

EASY backfill lets a job use a reservation's free GPUs only if it ends (by its time limit) before the
reservation starts. The GPUs are idle meanwhile whenever nothing that short waits, and a reservation's
start is a worst case from time limits: jobs usually end sooner, so it often comes due long after it
was made, or early. With ``Config.backfill_at_risk`` a Tier 2 or Tier 3 job that would outlive the
reservation may still start on those GPUs, *at risk* (``Placement.at_risk``; the caller keeps it as
``RunningJob.at_risk``). Tier 1 work is never lent them: it is never preempted.

When it comes due: an at-risk job counts, for every reservation, as gone within the grace period (it
would be stopped if its GPUs were needed), so it never delays the reserved job. Once the reserved job's
earliest start is within the grace period, the at-risk jobs on its GPUs are preempted with the usual
grace (SIGTERM, checkpoint, SIGKILL; requeued from the checkpoint), **however short a time they have
run**: ``Config.min_runtime_s`` does not protect a job that was lent reserved GPUs; that is the price
of starting early. What they lose is the work since their last checkpoint.

It needs preemption and backfill on. Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduling.core.types import Config, PendingJob, RunningJob, Tier

Loc = tuple[int, int]


def may_lend(job: PendingJob, config: Config) -> bool:
    """Whether ``job`` may start at risk on GPUs held for a reservation it would outlive."""
    return config.backfill_at_risk and config.backfill and config.preemption and job.tier != Tier.PRODUCTION


def lent(job: RunningJob) -> bool:
    """Whether a running job holds reserved GPUs at risk (never Tier 1, whatever the caller's flag says)."""
    return job.at_risk and job.tier != Tier.PRODUCTION


def due_victims(
    used: set[Loc],
    running: Iterable[RunningJob],
    locs: Mapping[str, tuple[Loc, ...]],
    spoken: set[str],
) -> list[RunningJob]:
    """The at-risk running jobs (not stopping, not already a victim in ``spoken``) on GPUs ``used`` by a
    reservation that is due: they are preempted for it."""
    return [
        j
        for j in running
        if lent(j) and not j.terminating and j.job_id not in spoken and any(loc in used for loc in locs[j.job_id])
    ]


def reason(reserved_for: str) -> str:
    return f"started at risk on GPUs reserved for job {reserved_for}; that reservation is due"
