"""The admission check's fast path gives the same verdict as the full admit, on random states."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.core.admission import admit
from scheduling.core.capacity import capacity_of, refusal
from scheduling.core.types import PendingJob, Snapshot, Tier
from tests.property.strategies import NOW, TEAMS, snapshots

# Beyond the usual shapes: too wide for any node, more replicas than nodes, types the cluster lacks.
job_shapes = st.tuples(st.integers(1, 40), st.sampled_from([1, 2, 3, 4, 8, 16]))


@settings(max_examples=300, deadline=None)
@given(snapshot=snapshots(), shape=job_shapes, tier=st.sampled_from(list(Tier)), data=st.data())
def test_the_fast_check_refuses_exactly_what_admit_refuses_and_says_the_same(
    snapshot: Snapshot, shape: tuple[int, int], tier: Tier, data: st.DataObject
) -> None:
    replicas, per = shape
    job = PendingJob(
        job_id="new",
        team=data.draw(st.sampled_from([*TEAMS, "nobody"])),
        tier=tier,
        replicas=replicas,
        gpus_per_replica=per,
        gpu_type=data.draw(st.sampled_from(["H100", "A100", "B200"])),
        submit_time=NOW,
        time_limit=3600.0,
    )
    full = admit(snapshot, job, now=NOW)
    fast = refusal(capacity_of(snapshot.topology), snapshot.quotas, job)
    assert (fast is None) == full.ok
    if not full.ok:
        assert fast == full.reason
