"""The guarantee claimed in tier order, on random states (scheduling/core/quota.py).

- A Tier 1 job whose team's Tier 1 work (the job included) fits the team's guarantee is never left
  pending while the GPUs and the quota it needs are held by work it may preempt: it is placed, or it
  preempts (or waits for stopping jobs) with a reservation, or, an ``auto`` gang, it holds a one-leaf
  reservation that comes sooner than spanning leaves by preemption would finish it. The oracle: the
  same cluster with every such job gone places it.
- Tier 1 jobs are never victims (checked for every plan by ``invariants.check_plan``, here too).
- Nothing else changes: where no team has running work of a lower tier than one of its pending
  jobs and no job had to preempt to stay under a limit, the plan is the one the pooled rule of
  before gives (a team's guarantee shared by all its tiers alike, limits never reclaimed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.plan import plan
from scheduling.core.quota import QuotaState
from scheduling.core.types import LeafLocality, PendingJob, RunningJob, Snapshot, Tier
from tests.property.invariants import check_plan
from tests.property.strategies import NOW, TEAMS, quota_trees, running_jobs, shapes, snapshots, topologies

FAST = settings(max_examples=200, deadline=None)


def _preemptible(job: RunningJob, snap: Snapshot) -> bool:
    """What a Tier 1 job may take: any Tier 2/3 job old enough, and anything already stopping."""
    return job.terminating or (job.tier != Tier.PRODUCTION and NOW - job.start >= snap.config.min_runtime_s)


@st.composite
def tier_1_arrivals(draw: st.DrawFn) -> tuple[Snapshot, PendingJob]:
    """A busy cluster (many running jobs of every tier) and one new Tier 1 job whose team's Tier 1 work
    fits its guarantee; the other pending jobs are Tier 2 and 3 (they come after it)."""
    topo = draw(topologies())
    busy = draw(running_jobs(topo, draw(st.integers(4, 20))))
    quotas = list(draw(quota_trees()))
    replicas, per = draw(shapes)
    job = PendingJob(
        job_id="t1",
        team=draw(st.sampled_from(TEAMS)),
        tier=Tier.PRODUCTION,
        replicas=replicas,
        gpus_per_replica=per,
        gpu_type=draw(st.sampled_from(["H100", "H100", "A100"])),
        submit_time=NOW,
        time_limit=3600.0,
    )
    tier_1_held = sum(j.gpu_count for j in busy if j.team == job.team and j.gpu_type == job.gpu_type and j.tier == 1)
    at = next(i for i, u in enumerate(quotas) if u.name == job.team)
    guarantee = draw(st.integers(tier_1_held + job.gpu_count, tier_1_held + job.gpu_count + 16))
    quotas[at] = replace(quotas[at], guaranteed={**quotas[at].guaranteed, job.gpu_type: guarantee})
    others = draw(snapshots()).pending
    pending = tuple(p for p in others if p.tier != Tier.PRODUCTION)
    snap = Snapshot(topo, busy, (*pending, job), tuple(quotas))
    return snap, job


@FAST
@given(tier_1_arrivals())
def test_a_tier_1_job_within_its_guarantee_is_never_left_waiting_on_preemptible_work(arrival):
    snap, job = arrival
    result = plan(snap, now=NOW)
    check_plan(snap, result, NOW)
    without = replace(
        snap,
        running=tuple(j for j in snap.running if not _preemptible(j, snap)),
        pending=(job,),
        config=replace(snap.config, preemption=False),
    )
    if not any(p.job_id == job.job_id for p in plan(without, now=NOW).placements):
        return  # it could not run even with every job it may take gone: nothing to require
    placed = any(p.job_id == job.job_id for p in result.placements)
    held = [r for r in result.reservations if r.job_id == job.job_id]
    reason = result.pending_reasons.get(job.job_id, "")
    reclaims = bool(held) and reason.startswith(("preempting", "waiting for stopping"))
    assert placed or reclaims or _waits_for_a_leaf_sooner_than_spanning(snap, job, held), reason


def _waits_for_a_leaf_sooner_than_spanning(snap: Snapshot, job: PendingJob, held: list) -> bool:
    """An ``auto`` gang may wait for one leaf instead (``locality``): only for a one-leaf reservation that
    starts before preempting across leaves (the victims' grace) plus what spanning would cost it would."""
    if job.locality != LeafLocality.AUTO or job.replicas < 2 or not held:
        return False
    (res,) = held
    leaf_of = {n.name: n.leaf for n in snap.topology.nodes}
    one_leaf = len({leaf_of[gpu.split("/")[0]] for gpu in res.gpus}) == 1
    cfg = snap.config
    return one_leaf and res.earliest_start - NOW < cfg.grace_period_s + cfg.span_slowdown * job.time_limit


@FAST
@given(tier_1_arrivals())
def test_tier_1_jobs_are_never_victims(arrival):
    snap, _ = arrival
    result = plan(snap, now=NOW)
    tiers = {j.job_id: j.tier for j in snap.running}
    assert all(tiers[p.job_id] != Tier.PRODUCTION for p in result.preemptions)


def _pooled_within(self: QuotaState, team: str, gpu_type: str, n: int, tier: int) -> bool:
    return team in self.units and self.held_of(team, gpu_type) + n <= self.guaranteed(team, gpu_type)


@contextlib.contextmanager
def pooled_rule() -> Iterator[None]:
    """The rule before tier claims: every tier of a team counted against its guarantee; a job over a
    limit waits, whatever holds the unit."""
    saved = QuotaState.within_guarantee, QuotaState.excess
    QuotaState.within_guarantee = _pooled_within  # type: ignore[method-assign]
    QuotaState.excess = lambda self, job: {}  # type: ignore[method-assign]
    try:
        yield
    finally:
        QuotaState.within_guarantee, QuotaState.excess = saved  # type: ignore[method-assign]


def _asks_nothing_new(snap: Snapshot) -> bool:
    """No pending job has running work of its own team and type of a lower tier (a higher number)."""
    lowest = {}
    for j in snap.running:
        key = (j.team, j.gpu_type)
        lowest[key] = max(lowest.get(key, 0), int(j.tier))
    return all(lowest.get((p.team, p.gpu_type), 0) <= p.tier for p in snap.pending)


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_nothing_changes_where_the_tier_rule_does_not_apply(snap):
    result = plan(snap, now=NOW)
    limit_reclaims = [r for r in result.pending_reasons.values() if "back under" in r]
    if not _asks_nothing_new(snap) or limit_reclaims:
        return
    with pooled_rule():
        assert plan(snap, now=NOW) == result
