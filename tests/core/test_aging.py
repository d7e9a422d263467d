"""Aging (``Config.age_first_s``): a job that has waited that long goes before the fair-share order."""

import math
from dataclasses import replace

from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import Config

ONE_NODE = cluster(nodes_per_leaf=1)
DAY = 86400.0
AGING = replace(Config(), age_first_s=DAY)
HEAVY_LIGHT = quota_tree({"heavy": {}, "light": {}}, usage={"heavy": {"H100": 1e9}, "light": {"H100": 0.0}})


def winner(pendings, *, now, config=AGING, quotas=HEAVY_LIGHT):
    """Which job gets the only node, when every job wants all of it."""
    result = plan(snapshot(ONE_NODE, pending=pendings, quotas=quotas, config=config), now=now)
    assert len(result.placements) == 1
    return result.placements[0].job_id


def test_a_job_that_waited_the_bound_goes_before_a_lighter_teams_fresh_job():
    jobs = [pending("old-heavy", team="heavy", submit_time=0.0), pending("new-light", team="light", submit_time=DAY)]
    assert winner(jobs, now=DAY) == "old-heavy"


def test_a_job_short_of_the_bound_keeps_its_fair_share_place():
    jobs = [pending("old-heavy", team="heavy", submit_time=1.0), pending("new-light", team="light", submit_time=DAY)]
    assert winner(jobs, now=DAY) == "new-light"


def test_without_aging_fair_share_orders_a_job_however_long_it_waited():
    jobs = [pending("old-heavy", team="heavy", submit_time=0.0), pending("new-light", team="light", submit_time=30 * DAY)]
    assert winner(jobs, now=30 * DAY, config=replace(Config(), age_first_s=math.inf)) == "new-light"


def test_aged_jobs_go_oldest_first_whatever_their_team():
    jobs = [
        pending("aged-light", team="light", submit_time=10.0),
        pending("aged-heavy", team="heavy", submit_time=5.0),
    ]
    assert winner(jobs, now=2 * DAY) == "aged-heavy"


def test_aged_jobs_keep_priority_before_submit_time():
    jobs = [
        pending("older", team="heavy", submit_time=0.0),
        pending("urgent", team="light", submit_time=10.0, priority=5),
    ]
    assert winner(jobs, now=2 * DAY) == "urgent"


def test_an_aged_borrower_stays_behind_work_within_its_teams_guarantee():
    # Guaranteed work first is what keeps a reclaim from being undone at the next cycle; aging must not
    # lift a borrowing job over it.
    quotas = quota_tree({"owner": {"H100": 8}, "light": {}}, usage={"owner": {"H100": 1e9}, "light": {"H100": 0.0}})
    jobs = [pending("aged-borrow", team="light", submit_time=0.0), pending("mine", team="owner", submit_time=3 * DAY)]
    assert winner(jobs, now=3 * DAY, quotas=quotas) == "mine"


# --------------------------------------------------------------------------- the aged reservation

TWO_NODES = cluster(nodes_per_leaf=2)  # n000, n001
NOW = 2 * DAY


def _both_busy():
    # n000 frees in an hour, n001 in two: every 8-GPU job waits.
    return [
        running("r0", [gpu_ids(TWO_NODES, "n000")], team="light", start=NOW - 60, time_limit=3600.0 + 60),
        running("r1", [gpu_ids(TWO_NODES, "n001")], team="light", start=NOW - 60, time_limit=7200.0 + 60),
    ]


def _reserved(jobs, config):
    result = plan(snapshot(TWO_NODES, running=_both_busy(), pending=jobs, quotas=HEAVY_LIGHT, config=config), now=NOW)
    return {r.job_id: r.earliest_start for r in result.reservations}


AGED_RESERVATION = replace(Config(), aged_reservation_s=DAY)


def test_the_oldest_job_past_the_bound_gets_a_reservation_beyond_the_first():
    jobs = [pending("light", team="light", submit_time=NOW - 60), pending("old", team="heavy", submit_time=0.0)]
    # Fair share orders "light" first and it takes the one reservation (n000, in an hour); "old" has
    # waited two days and gets the next node's end.
    assert _reserved(jobs, AGED_RESERVATION) == {"light": NOW + 3600.0, "old": NOW + 7200.0}


def test_without_the_guard_only_the_first_blocked_job_in_order_is_reserved():
    jobs = [pending("light", team="light", submit_time=NOW - 60), pending("old", team="heavy", submit_time=0.0)]
    assert _reserved(jobs, Config()) == {"light": NOW + 3600.0}


def test_a_job_short_of_the_bound_gets_no_extra_reservation():
    jobs = [pending("light", team="light", submit_time=NOW - 60), pending("young", team="heavy", submit_time=NOW - 3600)]
    assert _reserved(jobs, AGED_RESERVATION) == {"light": NOW + 3600.0}


def test_only_the_oldest_aged_job_gets_the_extra_reservation():
    jobs = [
        pending("light", team="light", submit_time=NOW - 60),
        pending("older", team="heavy", submit_time=0.0),
        pending("old", team="heavy", submit_time=10.0),
    ]
    assert set(_reserved(jobs, AGED_RESERVATION)) == {"light", "older"}
