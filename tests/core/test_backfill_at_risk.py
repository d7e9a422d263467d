"""EASY backfill at risk: reserved GPUs lent to preemptible work, taken back when the reservation is due."""

from dataclasses import replace

from scheduling.core import atrisk
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, running, snapshot
from scheduling.core.types import Config, LeafLocality, PendingJob, RunningJob, Tier

# Two leaves of four 8-GPU nodes: leaf-0 = n000..n003, leaf-1 = n004..n007.
TOPO = cluster(nodes_per_leaf=4, leaves_per_spine=2)
AT_RISK = Config(backfill_at_risk=True)
NOW = 10_000.0


def whole_node(job_id: str, node: str, *, ends: float, tier: Tier = Tier.RESEARCH, at_risk: bool = False) -> RunningJob:
    job = running(job_id, [gpu_ids(TOPO, node)], start=0.0, time_limit=ends, tier=tier)
    return replace(job, at_risk=at_risk)


def gang() -> PendingJob:
    return replace(pending("g", 4, 8, submit_time=0.0, time_limit=3600.0), locality=LeafLocality.REQUIRED)


# leaf-1 is full for long; leaf-0 has n000 busy until 20,000 s: the gang reserves leaf-0 from then,
# and n001..n003 are free meanwhile, held for it.
FULL_LEAF_1 = [whole_node(f"f{i}", f"n00{i}", ends=90_000.0) for i in range(4, 8)]
HEAD_WAITS = [whole_node("r0", "n000", ends=20_000.0), *FULL_LEAF_1]
LONG = pending("long", 1, 8, submit_time=1.0, time_limit=36_000.0)  # would outlive the reservation


def plan_with(running: list[RunningJob], jobs: list[PendingJob], config: Config = AT_RISK):
    return plan(snapshot(TOPO, running=running, pending=jobs, config=config), now=NOW)


def test_a_job_that_would_outlive_the_reservation_starts_at_risk_on_its_gpus():
    result = plan_with(HEAD_WAITS, [gang(), LONG])
    (p,) = result.placements
    assert p.job_id == "long" and p.at_risk
    assert p.nodes[0] in {"n001", "n002", "n003"}
    (res,) = result.reservations
    assert res.earliest_start == 20_000.0  # the job lent its GPUs does not move the reservation


def test_without_backfill_at_risk_it_waits_as_plain_easy_backfill():
    result = plan_with(HEAD_WAITS, [gang(), LONG], config=Config())
    assert [p.job_id for p in result.placements] == []


def test_a_job_that_ends_before_the_reservation_is_not_at_risk():
    short = pending("short", 1, 8, submit_time=1.0, time_limit=3600.0)
    (p,) = plan_with(HEAD_WAITS, [gang(), short]).placements
    assert p.job_id == "short" and not p.at_risk


def test_only_tier_2_and_3_work_may_be_lent_reserved_gpus_at_risk():
    # (A Tier 1 job is ordered before every Tier 2 reservation, so a plan never asks; the rule still holds.)
    assert [atrisk.may_lend(replace(LONG, tier=t), AT_RISK) for t in Tier] == [False, True, True]


def test_backfill_at_risk_needs_preemption_and_backfill():
    assert not atrisk.may_lend(LONG, replace(AT_RISK, preemption=False))
    assert not atrisk.may_lend(LONG, replace(AT_RISK, backfill=False))


def test_an_at_risk_job_does_not_delay_the_reservation_in_later_cycles():
    lent = whole_node("long", "n001", ends=NOW + 36_000.0, at_risk=True)
    result = plan_with([*HEAD_WAITS, lent], [gang()])
    (res,) = result.reservations
    assert res.earliest_start == 20_000.0
    assert result.preemptions == ()  # not due yet: it keeps running


def test_a_due_reservation_preempts_the_at_risk_job_on_its_gpus_whatever_its_run_time():
    # n000 is ending now; the at-risk job started a minute ago, well within min_runtime_s.
    started = replace(whole_node("long", "n001", ends=36_000.0, at_risk=True), start=NOW - 60.0)
    result = plan_with([whole_node("r0", "n000", ends=NOW), *FULL_LEAF_1, started], [gang()])
    (pre,) = result.preemptions
    assert (pre.job_id, pre.for_job, pre.grace_s) == ("long", "g", Config().grace_period_s)
    assert pre.reason == "started at risk on GPUs reserved for job g; that reservation is due"
    (res,) = result.reservations
    assert res.earliest_start == NOW + Config().grace_period_s
    assert "preempting at-risk job(s) long" in result.pending_reasons["g"]


def test_a_job_not_flagged_at_risk_is_never_preempted_by_a_due_reservation():
    young = replace(whole_node("other", "n001", ends=36_000.0), start=NOW - 60.0)
    result = plan_with([whole_node("r0", "n000", ends=NOW), *FULL_LEAF_1, young], [gang()])
    assert result.preemptions == ()


def test_a_tier_1_job_wrongly_flagged_at_risk_is_never_preempted():
    prod = replace(whole_node("prod", "n001", ends=36_000.0, tier=Tier.PRODUCTION, at_risk=True), start=NOW - 60.0)
    result = plan_with([whole_node("r0", "n000", ends=NOW), *FULL_LEAF_1, prod], [gang()])
    assert result.preemptions == ()
