"""``eta.Estimator`` keeps its model between cycles only where a fresh one would answer the same (or, past
an end or where an end hangs on ``now``, within ``keep_s`` seconds early), and rebuilds it when what it
read changes."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.eta import Estimator, start_estimates
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from tests.property.strategies import NOW, snapshots

CACHE = settings(max_examples=150, deadline=None)


@CACHE
@given(snapshots(), st.floats(0.0, 1.0))
def test_a_kept_model_answers_as_a_fresh_one_until_the_next_end(snap, share):
    result = plan(snap, now=NOW)
    kept = Estimator()
    assert kept.estimates(snap, result, now=NOW) == start_estimates(snap, result, now=NOW)
    model = kept._model
    if model is None or model.now_bound:
        return
    later = NOW + share * (min(model.horizon, NOW + 1e6) - NOW)
    if not model.valid_at(later):
        return  # (the horizon itself: an end happens there)
    assert kept.estimates(snap, result, now=later) == start_estimates(snap, result, now=later)
    assert kept.builds == 1


@CACHE
@given(snapshots(), st.floats(0.0, 300.0))
def test_a_model_kept_past_an_end_is_early_by_at_most_the_time_elapsed(snap, elapsed):
    result = plan(snap, now=NOW)
    kept = Estimator(keep_s=300.0)
    kept.estimates(snap, result, now=NOW)
    later = NOW + elapsed
    old, fresh = kept.estimates(snap, result, now=later), start_estimates(snap, result, now=later)
    assert kept.builds <= 1
    assert old.keys() == fresh.keys()
    for job_id, estimate in old.items():
        assert estimate.start <= fresh[job_id].start <= estimate.start + elapsed, job_id


TOPO = cluster(nodes_per_leaf=2)  # 2 nodes, 16 H100
QUOTAS = quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 16}})


def _state(**changes):
    busy = [
        running("a", [gpu_ids(TOPO, "n000")], team="vision", start=0.0, time_limit=3600),
        running("b", [gpu_ids(TOPO, "n001")], team="vision", start=0.0, time_limit=7200),
    ]
    snap = snapshot(TOPO, running=busy, pending=[pending("j", 1, 8, team="vision")], quotas=QUOTAS)
    return replace(snap, **changes)


def _check(estimator, snap, now):
    result = plan(snap, now=now)
    got = estimator.estimates(snap, result, now=now)
    assert got == start_estimates(snap, result, now=now)
    return got


def test_a_quiet_cycle_keeps_the_model_and_a_checkpoint_does_not_change_that():
    estimator = Estimator()
    snap = _state()
    assert _check(estimator, snap, 100.0)["j"].start == 3600
    _check(estimator, snap, 200.0)
    checkpointed = replace(snap, running=(replace(snap.running[0], last_checkpoint=150.0), snap.running[1]))
    _check(estimator, checkpointed, 300.0)
    assert estimator.builds == 1


def test_a_job_that_ends_or_a_new_limit_rebuilds_the_model():
    estimator = Estimator()
    snap = _state()
    _check(estimator, snap, 100.0)
    # Job a ended and job c took its node.
    ended = replace(snap, running=(running("c", [gpu_ids(TOPO, "n000")], team="vision", start=150.0), snap.running[1]))
    assert _check(estimator, ended, 200.0)["j"].start == 3750
    assert estimator.builds == 2
    tighter = replace(snap, quotas=quota_tree({"vision": {"H100": 8}}, limits={"vision": {"H100": 8}}))
    assert _check(estimator, tighter, 300.0)["j"].start == 7200
    assert estimator.builds == 3


def test_time_past_an_end_rebuilds_an_exact_model():
    estimator = Estimator()
    snap = _state()
    _check(estimator, snap, 100.0)
    assert _check(estimator, snap, 3700.0)["j"].start == 3700.0  # job a is past its time limit: "now"
    assert estimator.builds == 2


def test_a_stopping_job_keeps_the_model_only_for_keep_s():
    estimator = Estimator(keep_s=30.0)
    stopping = _state()
    stopping = replace(stopping, running=(replace(stopping.running[0], terminating=True), stopping.running[1]))
    result = plan(stopping, now=100.0)
    assert estimator.estimates(stopping, result, now=100.0)["j"].start == 160.0  # within its grace period
    kept = estimator.estimates(stopping, result, now=120.0)["j"].start
    assert estimator.builds == 1 and kept == 160.0  # 20 s early at most: a fresh one says 180
    assert start_estimates(stopping, result, now=120.0)["j"].start == 180.0
    assert estimator.estimates(stopping, result, now=140.0)["j"].start == 200.0
    assert estimator.builds == 2
