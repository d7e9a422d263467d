"""The estimates' model built over the running jobs' part kept from the last model (``eta_running``) is
the model built whole, cycle after cycle, while jobs end, start, are told to stop and time moves on."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core import eta_running
from scheduling.core.eta import _Model
from scheduling.core.free_state import FreeState
from scheduling.core.plan import plan
from scheduling.core.types import PendingJob, Placement, RunningJob, Snapshot
from tests.property.strategies import NOW, snapshots

STATE = ("free", "dfree", "type_free", "leaf_tfree", "spine_tfree", "leaf_hist", "pc", "pm", "cfree", "mfree", "skew")


def _same(over: _Model, whole: _Model, snap: Snapshot) -> None:
    assert over.releases == whole.releases
    assert (over.horizon, over.now_bound) == (whole.horizon, whole.now_bound)
    assert over.unit_keys() == whole.unit_keys()
    for key in whole.unit_keys():
        assert over.holdings(key) == whole.holdings(key), key
    for name in STATE:
        assert getattr(over.free, name) == getattr(whole.free, name), name
    for job in snap.pending:
        assert over.estimate(job) == whole.estimate(job), job.job_id


def _started(job: PendingJob, placement: Placement, now: float) -> RunningJob:
    return RunningJob(
        job_id=job.job_id,
        team=job.team,
        tier=job.tier,
        gpu_type=job.gpu_type,
        replicas=placement.replicas,
        start=now,
        time_limit=job.time_limit,
        cpus_per_replica=job.cpus_per_replica,
        memory_mb_per_replica=job.memory_mb_per_replica,
    )


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.data())
def test_the_model_over_the_kept_part_is_the_model_built_whole(snap, data):
    now = NOW
    for step in range(4):
        result = plan(snap, now=now)
        over = _Model(snap, result, now)
        if step and len({j.job_id for j in snap.running}) == len(snap.running):
            assert over._part is not None and eta_running._LAST[0].running is snap.running
        _same(over, _Model(snap, result, now, whole=True), snap)
        # The next cycle: some jobs end, the placed ones start, some are told to stop, time moves on
        # (sometimes past ends and grace periods).
        pending = {j.job_id: j for j in snap.pending}
        placed = {p.job_id: p for p in result.placements}
        ended = data.draw(st.sets(st.sampled_from([j.job_id for j in snap.running]))) if snap.running else set()
        stopping = data.draw(st.sets(st.sampled_from([j.job_id for j in snap.running]))) if snap.running else set()
        now += data.draw(st.sampled_from([0.0, 1.0, 30.0, 600.0, 20_000.0]))
        running = tuple(
            replace(j, terminating=True) if j.job_id in stopping and not j.terminating else j
            for j in snap.running
            if j.job_id not in ended
        ) + tuple(_started(pending[job_id], p, now) for job_id, p in placed.items() if job_id in pending)
        snap = replace(snap, running=running, pending=tuple(j for j in snap.pending if j.job_id not in placed))


@settings(max_examples=100, deadline=None)
@given(snapshots())
def test_a_part_built_whole_is_the_part_changed_job_by_job(snap):
    """From an empty part, every job came: the part changed job by job is the part built whole."""
    from scheduling.core.index import running_locs, topo_index
    from scheduling.core.quota import QuotaState

    if len({j.job_id for j in snap.running}) != len(snap.running):
        return
    ix = topo_index(snap.topology)
    quota = QuotaState(snap.quotas, ())
    locs = running_locs(ix, snap.running).locs
    tree = tuple((u.name, u.parent) for u in snap.quotas)
    whole = eta_running._whole(ix, tree, quota, snap.running, {j.job_id: j for j in snap.running}, locs)
    empty = eta_running._whole(ix, tree, quota, (), {}, locs)
    changed = eta_running._changed(empty, tree, quota, snap.running, {j.job_id: j for j in snap.running}, locs)
    assert changed.releases == whole.releases
    assert {k: v for k, v in changed.by_unit.items() if v} == {k: v for k, v in whole.by_unit.items() if v}
    assert changed.owner == whole.owner and changed.terminating == whole.terminating


def test_free_state_fields_compared_exist():
    assert set(STATE) <= set(FreeState.__slots__)


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.booleans())
def test_an_earliest_fit_asked_for_its_time_alone_finds_the_same_time(snap, one_leaf):
    """``earliest_fit(when_only=True)`` (the estimates' search, which skips giving back the GPUs of nodes a
    replica cannot use) finds the time the whole search does, and a placement that fits then."""
    from scheduling.core.backfill import earliest_fit

    model = _Model(snap, plan(snap, now=NOW), NOW, whole=True)
    for job in snap.pending:
        whole = earliest_fit(model.free, model.releases, set(), job, one_leaf=one_leaf)
        when = earliest_fit(model.free, model.releases, set(), job, one_leaf=one_leaf, when_only=True)
        assert (whole is None) == (when is None), job.job_id
        if whole is not None and when is not None:
            assert when[0] == whole[0], job.job_id
            assert sum(len(p) for _, p in when[1].replicas) == job.gpu_count, job.job_id
