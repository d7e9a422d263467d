"""The admission preview and the next cycle agree, given the same state.

The preview plans the new job as "new" (it has no id yet); the cycle plans it under its database id,
the next one. Every other input is the same, so the victims, the reservation and the estimated start
the preview names must be the ones the cycle's plan has. Ids are numbers as text here, as in the
portal, and submit times tie (a batch submitted at once), so an order that read ids as text would
put "10" before "9" in the cycle and "new" after it in the preview.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.eta import admit, with_estimates
from scheduling.core.plan import plan
from scheduling.core.testing import cluster, gpu_ids, pending, quota_tree, running, snapshot
from scheduling.core.types import PendingJob, Plan, Snapshot, Tier
from tests.property.strategies import NOW, TEAMS, snapshots


def _numbered(snap: Snapshot, submit_time: float | None) -> Snapshot:
    """Ids 1.. for the running jobs, then the pending ones, as a database would have given them."""
    busy = tuple(replace(j, job_id=str(i + 1)) for i, j in enumerate(snap.running))
    waiting = tuple(
        replace(j, job_id=str(len(busy) + i + 1), submit_time=j.submit_time if submit_time is None else submit_time)
        for i, j in enumerate(snap.pending)
    )
    return replace(snap, running=busy, pending=waiting)


def _cycle(snap: Snapshot, job: PendingJob) -> Plan:
    queued = replace(snap, pending=(*snap.pending, job))
    return with_estimates(queued, plan(queued, now=NOW), now=NOW)


def _for(result: Plan, job_id: str) -> tuple[object, ...]:
    """What a plan says about one job: its victims, its reservation, its start, placed or not."""
    return (
        sorted(p.job_id for p in result.preemptions if p.for_job == job_id),
        [(r.domain, r.gpus, r.earliest_start) for r in result.reservations if r.job_id == job_id],
        result.estimated_start.get(job_id),
        [p.replicas for p in result.placements if p.job_id == job_id],
    )


@settings(max_examples=300, deadline=None)
@given(snap=snapshots(), tie=st.booleans(), data=st.data())
def test_the_preview_names_what_the_cycle_does(snap: Snapshot, tie: bool, data: st.DataObject) -> None:
    snap = _numbered(snap, NOW if tie else None)
    job = PendingJob(
        job_id="new",
        team=data.draw(st.sampled_from(TEAMS)),
        tier=data.draw(st.sampled_from(list(Tier))),
        replicas=data.draw(st.integers(1, 4)),
        gpus_per_replica=data.draw(st.sampled_from([1, 2, 4, 8])),
        gpu_type="H100",
        submit_time=NOW,
        time_limit=3600.0,
        priority=data.draw(st.integers(0, 2)),
    )
    real = replace(job, job_id=str(len(snap.running) + len(snap.pending) + 1))
    preview, cycle = _cycle(snap, job), _cycle(snap, real)
    assert _for(preview, "new") == _for(cycle, real.job_id)
    # Everyone else's fate is the same too: the new job took the same place in the queue.
    others = [j.job_id for j in snap.pending]
    assert [_for(preview, j) for j in others] == [_for(cycle, j) for j in others]
    # And the preview's words are the cycle's reason (the job's own id aside).
    verdict = admit(snap, job, now=NOW)
    why = cycle.pending_reasons.get(real.job_id)
    if why is not None and verdict.ok:
        assert verdict.reason.endswith(why.replace(f"job {real.job_id}", "job new"))


def test_a_tie_on_submit_time_orders_9_before_10_and_the_preview_alike():
    # Two nodes of spot work; "y" has less to lose. Job 9 is queued; the new job ties with it.
    topo = cluster(nodes_per_leaf=2)
    busy = [
        running("1", [gpu_ids(topo, "n000")], team="spot", tier=Tier.SPOT, start=0.0),
        running("2", [gpu_ids(topo, "n001")], team="spot", tier=Tier.SPOT, start=NOW - 1000.0),
    ]
    quotas = quota_tree({"owner": {"H100": 16}, "spot": {"H100": 0}})
    queued = [pending("9", 1, 8, team="owner", submit_time=NOW)]
    snap = snapshot(topo, running=busy, pending=queued, quotas=quotas)
    new = pending("new", 1, 8, team="owner", submit_time=NOW)
    preview = _cycle(snap, new)
    cycle = _cycle(snap, replace(new, job_id="10"))
    assert _for(preview, "new") == _for(cycle, "10") == (["1"], _for(cycle, "10")[1], NOW + 60.0, [])
    assert _for(cycle, "9")[0] == ["2"]  # job 9 came first: the cheaper victim is its
