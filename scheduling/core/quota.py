"""Hierarchical quotas: guarantees, limits (of a team and every ancestor) and borrowing.

A unit with no guarantee entry for a GPU type has guarantee 0 for it; a missing limit
entry means no limit. GPUs held by running jobs (terminating ones too: they still hold
their GPUs) count toward a team and all its ancestors.

How a team's guarantee is shared between its tiers: it is claimed in tier order. Tier 1
work claims it first, then Tier 2, then Tier 3 (within a tier, the oldest running job
first). So a job of tier k is *within guarantee* when the team's work of tiers 1..k,
the job included, fits in the guarantee: the team's own lower-tier work never makes its
higher-tier work borrow. What a tier leaves unclaimed is what the next one may use; work
beyond the guarantee borrows and may be reclaimed. Limits count every tier alike: they
cap what a unit holds, whoever holds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduling.core.types import PendingJob, QuotaUnit, RunningJob, Tier

_PRODUCTION = Tier.PRODUCTION  # asked of every pending job: an enum member read is a class attribute lookup
_NO_CLAIMS = (0, 0, 0, 0)


class QuotaState:
    def __init__(self, units: Iterable[QuotaUnit], running: Iterable[RunningJob]) -> None:
        self.units = {u.name: u for u in units}
        self.held: dict[str, dict[str, int]] = {name: {} for name in self.units}
        # (team, type) -> GPUs its own jobs hold of tiers 1..k, at index k (index 0 unused): what
        # claims the team's guarantee before a job of tier k does.
        self.claims: dict[tuple[str, str], list[int]] = {}
        self._chains: dict[str, tuple[str, ...]] = {}
        self._limited: dict[tuple[str, str], tuple[tuple[str, int, dict[str, int]], ...]] = {}
        totals: dict[tuple[str, str, int], int] = {}
        for job in running:
            key = (job.team, job.gpu_type, int(job.tier))
            totals[key] = totals.get(key, 0) + sum(map(len, job.replicas))
        for (team, gpu_type, tier), n in sorted(totals.items()):
            self.add(team, gpu_type, n, tier)

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

    def add(self, team: str, gpu_type: str, n: int, tier: int) -> None:
        for name in self.chain(team):
            held = self.held[name]
            held[gpu_type] = held.get(gpu_type, 0) + n
        claims = self.claims.get((team, gpu_type))
        if claims is None:
            claims = self.claims[(team, gpu_type)] = [0, 0, 0, 0]
        for k in range(tier, 4):
            claims[k] += n

    def held_of(self, name: str, gpu_type: str) -> int:
        return self.held.get(name, {}).get(gpu_type, 0)

    def claimed(self, team: str, gpu_type: str, tier: int) -> int:
        """GPUs the team's own jobs of tiers 1..``tier`` hold: the part of its guarantee they claim first."""
        return self.claims.get((team, gpu_type), _NO_CLAIMS)[tier]

    def guaranteed(self, name: str, gpu_type: str) -> int:
        return self.units[name].guaranteed.get(gpu_type, 0)

    def within_guarantee(self, team: str, gpu_type: str, n: int, tier: int) -> bool:
        """Whether ``n`` more GPUs of a job of ``tier`` fit in what the team's work of tiers 1..tier leaves
        of its guarantee. Asked for every pending job, often twice: plain dict reads."""
        unit = self.units.get(team)
        if unit is None:
            return False
        return self.claims.get((team, gpu_type), _NO_CLAIMS)[tier] + n <= unit.guaranteed.get(gpu_type, 0)

    def limits(self, team: str, gpu_type: str) -> tuple[tuple[str, int, dict[str, int]], ...]:
        """(unit, its limit, its held GPUs by type) for each unit of the team's chain that limits the type,
        team first. Limits are fixed for a plan and ``held`` is the live dict, so this is built once per
        team and type instead of walking the chain and its mappings for every pending job."""
        key = (team, gpu_type)
        found = self._limited.get(key)
        if found is None:
            found = self._limited[key] = tuple(
                (name, limit, self.held[name])
                for name in self.chain(team)
                if (limit := self.units[name].limit.get(gpu_type)) is not None
            )
        return found

    def blocked(self, job: PendingJob) -> str | None:
        """Why the job's team (or an ancestor) may not take ``job`` now, or None."""
        t, n = job.gpu_type, job.gpu_count
        if job.team not in self.units:
            return f"team {job.team} is not in the quota tree; ask an admin to add it"
        if job.tier == _PRODUCTION and not self.within_guarantee(job.team, t, n, _PRODUCTION):
            held, g = self.claimed(job.team, t, _PRODUCTION), self.guaranteed(job.team, t)
            return (
                f"Tier 1 runs only within guarantee: team {job.team}'s Tier 1 jobs hold {held}/{g} guaranteed {t}, needs {n} more"
            )
        for name, limit, held_now in self.limits(job.team, t):
            if held_now.get(t, 0) + n > limit:
                held, g = self.held_of(name, t), self.guaranteed(name, t)
                who = "team" if name == job.team else "parent unit"
                return f"over {who} {name} quota for {t} ({held}/{g} guaranteed, {limit_words(limit, held, n, t)})"
        return None

    def excess(self, job: PendingJob) -> dict[str, int]:
        """Unit -> how many GPUs of the job's type it would hold beyond its limit with ``job`` placed
        (only the units of the job's chain whose limit it would pass)."""
        t, n = job.gpu_type, job.gpu_count
        return {name: over for name, limit, held_now in self.limits(job.team, t) if (over := held_now.get(t, 0) + n - limit) > 0}

    def would_borrow(self, team: str, gpu_type: str, n: int, tier: int) -> bool:
        return not self.within_guarantee(team, gpu_type, n, tier)


def guarantee_by_tier(guaranteed: int, held: Mapping[int, int]) -> tuple[tuple[int, int, int], int]:
    """How a team's guarantee of one GPU type is held, by the rule above: (GPUs of it that its Tier 1,
    Tier 2 and Tier 3 work claim, in that order), and how many more GPUs it holds beyond it (borrowed).
    ``held``: tier -> GPUs the team's running jobs of that tier hold. (The quota page shows this.)"""
    left = guaranteed
    claims = []
    for tier in (Tier.PRODUCTION, Tier.RESEARCH, Tier.SPOT):
        n = min(held.get(tier, 0), max(left, 0))
        claims.append(n)
        left -= n
    return (claims[0], claims[1], claims[2]), sum(held.values()) - sum(claims)


def borrowed_running(units: Iterable[QuotaUnit], running: Iterable[RunningJob]) -> dict[str, bool]:
    """Each running job -> True when it runs (partly) beyond its team's guarantee.

    Within a team and GPU type, the guarantee is claimed in tier order (Tier 1 first), and
    within a tier by the oldest jobs: the newest work of the lowest tier is what borrows, so
    it is what a reclaim takes back.
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


def limit_words(limit: int, held: int, n: int, gpu_type: str) -> str:
    """Why a limit stops a job of ``n`` GPUs while the unit holds ``held``: 'limit 8 reached; needs 2 more',
    or 'limit 200 H100, 1 in use, 199 free; the job needs 200'."""
    if held >= limit:
        return f"limit {limit} reached; needs {n} more"
    return f"limit {limit} {gpu_type}, {held} in use, {limit - held} free; the job needs {n}"
