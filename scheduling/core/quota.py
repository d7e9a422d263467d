"""Hierarchical quotas: guarantees, limits (of a team and every ancestor) and borrowing.

A unit with no guarantee entry for a GPU type has guarantee 0 for it; a missing limit
entry means no limit. GPUs held by running jobs (terminating ones too: they still hold
their GPUs) count toward a team and all its ancestors.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduling.core.types import PendingJob, QuotaUnit, RunningJob, Tier


class QuotaState:
    def __init__(self, units: Iterable[QuotaUnit], running: Iterable[RunningJob]) -> None:
        self.units = {u.name: u for u in units}
        self.held: dict[str, dict[str, int]] = {name: {} for name in self.units}
        self._chains: dict[str, tuple[str, ...]] = {}
        totals: dict[tuple[str, str], int] = {}
        for job in running:
            key = (job.team, job.gpu_type)
            totals[key] = totals.get(key, 0) + sum(map(len, job.replicas))
        for (team, gpu_type), n in sorted(totals.items()):
            self.add(team, gpu_type, n)

    def chain(self, team: str) -> tuple[str, ...]:
        """The team and its ancestors, the team first."""
        if team not in self._chains:
            out: list[str] = []
            name: str | None = team
            while name is not None and name in self.units and name not in out:
                out.append(name)
                name = self.units[name].parent
            self._chains[team] = tuple(out)
        return self._chains[team]

    def add(self, team: str, gpu_type: str, n: int) -> None:
        for name in self.chain(team):
            held = self.held[name]
            held[gpu_type] = held.get(gpu_type, 0) + n

    def held_of(self, name: str, gpu_type: str) -> int:
        return self.held.get(name, {}).get(gpu_type, 0)

    def guaranteed(self, name: str, gpu_type: str) -> int:
        return self.units[name].guaranteed.get(gpu_type, 0)

    def within_guarantee(self, team: str, gpu_type: str, n: int) -> bool:
        return team in self.units and self.held_of(team, gpu_type) + n <= self.guaranteed(team, gpu_type)

    def blocked(self, job: PendingJob) -> str | None:
        """Why the job's team (or an ancestor) may not take ``job`` now, or None."""
        t, n = job.gpu_type, job.gpu_count
        if job.team not in self.units:
            return f"team {job.team} is not in the quota tree; ask an admin to add it"
        if job.tier == Tier.PRODUCTION and not self.within_guarantee(job.team, t, n):
            held, g = self.held_of(job.team, t), self.guaranteed(job.team, t)
            return f"Tier 1 runs only within guarantee: team {job.team} holds {held}/{g} guaranteed {t}, needs {n} more"
        for name in self.chain(job.team):
            limit = self.units[name].limit.get(t)
            if limit is not None and self.held_of(name, t) + n > limit:
                held, g = self.held_of(name, t), self.guaranteed(name, t)
                who = "team" if name == job.team else "parent unit"
                return f"over {who} {name} quota for {t} ({held}/{g} guaranteed, limit {limit} reached; needs {n} more)"
        return None

    def would_borrow(self, team: str, gpu_type: str, n: int) -> bool:
        return not self.within_guarantee(team, gpu_type, n)


def borrowed_running(units: Iterable[QuotaUnit], running: Iterable[RunningJob]) -> dict[str, bool]:
    """Each running job -> True when it runs (partly) beyond its team's guarantee.

    Within a team and GPU type, the guarantee covers Tier 1 first, then the oldest jobs:
    the newest work is what borrows, so it is what a reclaim takes back.
    """
    guarantees = {u.name: u.guaranteed for u in units}
    groups: dict[tuple[str, str], list[RunningJob]] = {}
    for job in running:
        groups.setdefault((job.team, job.gpu_type), []).append(job)
    out: dict[str, bool] = {}
    for (team, gpu_type), jobs in sorted(groups.items()):
        left = guarantees.get(team, {}).get(gpu_type, 0)
        for job in sorted(jobs, key=lambda j: (j.tier, j.start, j.job_id)):
            n = sum(map(len, job.replicas))
            out[job.job_id] = n > left
            left = max(left - n, 0)
    return out
