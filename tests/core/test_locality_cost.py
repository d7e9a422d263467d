"""Leaf locality decided by cost: a gang waits for one leaf only while that wait costs less than spanning."""

import math
from dataclasses import replace

import pytest

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, running, snapshot
from scheduling.core.types import Config, LeafLocality, Locality, PendingJob, RunningJob, Tier

# Two leaves of four 8-GPU nodes: leaf-0 = n000..n003, leaf-1 = n004..n007.
TOPO = cluster(nodes_per_leaf=4, leaves_per_spine=2)
TOPO_LEAF = {n.name: n.leaf for n in TOPO.nodes}


def busy(ends: dict[str, float]) -> list[RunningJob]:
    """One whole-node job on each named node, ending (by its time limit) at the given time."""
    return [running(f"r-{name}", [gpu_ids(TOPO, name)], time_limit=end) for name, end in ends.items()]


# A leaf frees in an hour (leaf-0 once n000 ends); six free nodes hold the gang across leaves now.
ONE_PER_LEAF = busy({"n000": 3600.0, "n004": 7200.0})


def gang(limit: float, locality: LeafLocality = LeafLocality.AUTO) -> PendingJob:
    return replace(pending("g", 4, 8, time_limit=limit), locality=locality)


def plan_one(job: PendingJob, running: list[RunningJob] = ONE_PER_LEAF, config: Config | None = None):
    return plan(snapshot(TOPO, running=running, pending=[job], config=config), now=0.0)


def test_auto_gang_spans_now_when_the_leaf_wait_costs_more_than_spanning():
    # 25 % of a 1 h limit is 15 min: less than the hour it would wait for leaf-0.
    (p,) = plan_one(gang(3600.0)).placements
    assert (p.locality, p.leaves) == (Locality.SPINE, 2)


def test_auto_gang_waits_for_a_leaf_when_the_wait_costs_less_than_spanning():
    # 25 % of a 10 h limit is 2.5 h: more than the hour it waits for leaf-0.
    result = plan_one(gang(36_000.0))
    assert result.placements == ()
    (res,) = result.reservations
    assert (res.domain, res.earliest_start) == ("leaf-0", 3600.0)


def test_waiting_auto_gang_is_told_why_it_waits_for_one_leaf():
    reason = plan_one(gang(36_000.0)).pending_reasons["g"]
    assert reason.endswith(
        "; one leaf switch (auto): one is expected in ~60 min, sooner than spanning now would cost "
        "(~2 h 30 min, 25 % of its 10 h limit)"
    )


def test_the_deployment_factor_sets_the_cost_of_spanning():
    # 200 % of a 1 h limit is 2 h: more than the hour's wait, so the same gang now waits.
    assert plan_one(gang(3600.0), config=Config(span_slowdown=2.0)).placements == ()


def test_required_gang_waits_however_little_spanning_would_cost():
    result = plan_one(gang(3600.0, LeafLocality.REQUIRED))
    assert result.placements == ()
    assert result.pending_reasons["g"].endswith("; one leaf switch: required by the job")


def test_preferred_gang_spans_at_once_however_long_it_runs():
    (p,) = plan_one(gang(10 * 86400.0, LeafLocality.PREFERRED)).placements
    assert p.leaves == 2


def test_preferred_gang_still_takes_one_leaf_when_one_has_room():
    (p,) = plan_one(gang(3600.0, LeafLocality.PREFERRED), running=busy({"n000": 3600.0})).placements
    assert (p.locality, p.leaves, p.nodes) == (Locality.LEAF, 1, ("n004", "n005", "n006", "n007"))


@pytest.mark.parametrize(("factor", "placed"), [(math.inf, False), (0.0, True)])
def test_an_infinite_factor_makes_auto_required_and_zero_makes_it_preferred(factor: float, placed: bool):
    result = plan_one(gang(10 * 86400.0 if placed else 60.0), config=Config(span_slowdown=factor))
    assert bool(result.placements) is placed


# Nothing fits now: three free nodes. Across leaves the gang fits at 1,000 s (n000 and n004 end);
# under one leaf at 2,000 s (leaf-1 once n004, n005 and n007 have ended).
NOTHING_NOW = busy({"n000": 1000.0, "n001": 50_000.0, "n004": 1000.0, "n005": 2000.0, "n007": 1500.0})


def test_blocked_auto_gang_reserves_across_leaves_when_one_leaf_is_later_by_more_than_the_cost():
    result = plan_one(gang(3600.0), running=NOTHING_NOW)  # one leaf is 1,000 s later; spanning costs 900 s
    (res,) = result.reservations
    assert (res.domain, res.earliest_start) == ("spine-0", 1000.0)
    assert result.pending_reasons["g"].endswith(
        "; any leaves (auto): expected in ~17 min, one leaf in ~33 min, later by more than spanning would cost "
        "(~15 min, 25 % of its 60 min limit)"
    )


def test_blocked_auto_gang_reserves_one_leaf_when_it_is_later_by_less_than_the_cost():
    result = plan_one(gang(7200.0), running=NOTHING_NOW)  # spanning would cost 1,800 s
    (res,) = result.reservations
    assert (res.domain, res.earliest_start) == ("leaf-1", 2000.0)
    assert result.pending_reasons["g"].endswith(
        "; one leaf switch (auto): expected in ~33 min; leaves in ~17 min would cost ~30 min more"
    )


def test_a_gang_past_the_leaf_wait_bound_spans_whatever_its_locality():
    job = replace(gang(36_000.0, LeafLocality.REQUIRED), submit_time=-700.0)
    (p,) = plan_one(job, config=Config(leaf_wait_s=600.0)).placements
    assert p.leaves == 2


def test_one_node_jobs_are_never_given_a_locality_note():
    result = plan(snapshot(TOPO, running=busy({f"n00{i}": 3600.0 for i in range(8)}), pending=[pending("s", 1, 8)]), now=0.0)
    assert "leaf" not in result.pending_reasons["s"].split(";")[-1]


def test_past_the_plans_search_budget_an_auto_gang_waits_for_one_leaf_and_weighs_at_the_next_cycle():
    # The gang that spans now with a budget (the first test) waits for one leaf without one, and says so.
    result = plan_one(gang(3600.0), config=Config(max_leaf_searches=0))
    assert result.placements == ()
    assert "it weighs a leaf against spanning at the next (at most 0 gangs do in one cycle)" in result.pending_reasons["g"]


# Preempting gives a gang a spanning start of its own. Every node runs spot work (Tier 3) until 10 h,
# and n000 and n004 each also run one GPU of a Tier 1 job until then: with the spot work gone each leaf
# has three whole nodes, too few for a 4-node gang, while across leaves there are six.
LONG = 36_000.0
SPOT_EVERYWHERE = [
    *(running(f"t1-{n}", [gpu_ids(TOPO, n, [0])], tier=Tier.PRODUCTION, time_limit=LONG) for n in ("n000", "n004")),
    *(
        running(f"spot-{n}", [gpu_ids(TOPO, n, range(1, 8))], tier=Tier.SPOT, start=-3600.0, time_limit=LONG + 3600.0)
        for n in ("n000", "n004")
    ),
    *(
        running(f"spot-{n}", [gpu_ids(TOPO, n)], tier=Tier.SPOT, start=-3600.0, time_limit=LONG + 3600.0)
        for n in ("n001", "n002", "n003", "n005", "n006", "n007")
    ),
]


def production_gang(locality: LeafLocality) -> PendingJob:
    return replace(gang(3600.0, locality), tier=Tier.PRODUCTION)


def test_an_auto_gang_that_cannot_free_one_leaf_preempts_across_leaves_rather_than_wait_for_one():
    # Waiting for one leaf would take 10 h; preempting across leaves starts it after the victims' grace.
    result = plan(snapshot(TOPO, running=SPOT_EVERYWHERE, pending=[production_gang(LeafLocality.AUTO)]), now=0.0)
    victims = {p.job_id for p in result.preemptions}
    assert len(victims) == 4 and all(v.startswith("spot-") for v in victims)
    (res,) = result.reservations
    assert res.earliest_start == Config().grace_period_s
    assert len({gpu.split("/")[0] for gpu in res.gpus}) == 4
    assert {TOPO_LEAF[gpu.split("/")[0]] for gpu in res.gpus} == {"leaf-0", "leaf-1"}
    reason = result.pending_reasons["g"]
    assert reason.startswith("preempting 4 job(s)")
    assert reason.endswith(
        "; any leaves (auto): no leaf has room even with its victims gone, one leaf expected not sooner, "
        "later by more than spanning would cost (~15 min, 25 % of its 60 min limit)"
    )


def test_a_required_gang_that_cannot_free_one_leaf_waits_for_one():
    result = plan(snapshot(TOPO, running=SPOT_EVERYWHERE, pending=[production_gang(LeafLocality.REQUIRED)]), now=0.0)
    assert result.preemptions == ()
    (res,) = result.reservations
    assert res.domain in ("leaf-0", "leaf-1") and res.earliest_start == LONG


def test_an_auto_gang_keeps_waiting_for_a_leaf_that_comes_sooner_than_spanning_would_cost():
    # The same cluster with every job ending in 10 min: the leaf is 10 min away, spanning costs 15 min.
    soon = [replace(j, time_limit=j.start * -1 + 600.0) for j in SPOT_EVERYWHERE]
    result = plan(snapshot(TOPO, running=soon, pending=[production_gang(LeafLocality.AUTO)]), now=0.0)
    assert result.preemptions == ()
    (res,) = result.reservations
    assert res.domain.startswith("leaf-") and res.earliest_start == 600.0


def test_a_gang_that_would_span_by_preempting_but_may_not_preempt_this_cycle_says_it_waits_for_one_leaf():
    config = Config(max_reclaims=0)
    snap = snapshot(TOPO, running=SPOT_EVERYWHERE, pending=[production_gang(LeafLocality.AUTO)], config=config)
    result = plan(snap, now=0.0)
    assert result.preemptions == ()
    reason = result.pending_reasons["g"]
    assert "any leaves (auto)" not in reason and "may preempt at the next cycle" in reason
