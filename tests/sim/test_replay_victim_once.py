"""The replay that stopped with PlanError: a due reservation and a reclaim took the same at-risk job.

Seven jobs on 8 nodes (2 leaves of 4), shrunk from a random trace. At 7140 s job j4 (team c, 32 GPUs,
beyond its guarantee: it may not preempt) reserves a leaf that comes due within the grace period, so
the at-risk gang j7 on it is preempted; j15 (team c, 8 GPUs, within the guarantee) then reclaimed j7
a second time, and the engine refused the plan ("preempts j7, which is not running or already
stopping"). Before the fix this replay stops there; now it completes with j7 stopped once.

The same replay from the command line, with ``JOBS`` written as a trace CSV and a quotas CSV of teams a, b
and c of size 1 each (``--believed-slowdown 0``: auto gangs span as preferred ones)::

    python -m scheduling.sim --trace trace.csv --quotas quotas.csv --nodes 8 --nodes-per-leaf 4 \
        --leaves-per-spine 2 --gang-heavy-nodes 0 --policies yardmaster --time-limits oracle \
        --slowdowns 0.25 --believed-slowdown 0 --busy-from 0 --jobs 1
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from scheduling.core.plan import plan
from scheduling.core.types import Config, LeafLocality, Plan, Snapshot
from scheduling.sim.cluster import ClusterShape
from scheduling.sim.engine import Replay
from scheduling.sim.replay_types import ReplayConfig
from scheduling.sim.trace import TraceJob, time_limits

# (job id, submit time, duration, GPUs, team)
JOBS = [
    TraceJob(job_id, float(submit), float(duration), gpus, team, "u", "completed", "")
    for job_id, submit, duration, gpus, team in [
        ("j0", 1800, 7200, 2, "b"),
        ("j2", 3600, 3600, 24, "b"),
        ("j3", 3600, 7200, 8, "a"),
        ("j4", 4200, 20000, 32, "c"),
        ("j5", 4200, 20000, 8, "c"),
        ("j7", 4320, 7200, 16, "b"),
        ("j15", 7110, 3600, 8, "c"),
    ]
]
SHAPE = ClusterShape(nodes=8, gpus_per_node=8, nodes_per_leaf=4, leaves_per_spine=2)


def replay(locality: LeafLocality | None, believed: float) -> tuple[Replay, list[tuple[float, Plan]]]:
    plans: list[tuple[float, Plan]] = []

    def policy(snapshot: Snapshot, *, now: float) -> Plan:
        if locality is not None:
            snapshot = replace(snapshot, pending=tuple(replace(j, locality=locality) for j in snapshot.pending))
        result = plan(snapshot, now=now)
        plans.append((now, result))
        return result

    r = Replay(
        JOBS,
        policy,
        shape=SHAPE,
        limits=time_limits(JOBS, "oracle"),
        team_weights={"a": 1.0, "b": 1.0, "c": 1.0},
        # The 60 s grid the failure was found on (it came at 7,140 s, a grid point).
        config=ReplayConfig(
            cycle_s=60.0, span_slowdown=0.25, core=replace(Config(), span_slowdown=believed, backfill_at_risk=True)
        ),
        name="yardmaster",
    )
    return r, plans


@pytest.mark.parametrize(
    ("locality", "believed"),
    [(None, 0.0), (LeafLocality.PREFERRED, 0.25), (LeafLocality.PREFERRED, 0.0)],
    ids=["auto-believing-0", "preferred-25%", "preferred-0"],
)
def test_the_replay_that_preempted_one_job_twice_completes(locality: LeafLocality | None, believed: float) -> None:
    r, plans = replay(locality, believed)
    result = r.run()  # raised PlanError at 7140 s before the fix
    assert not result.unfinished
    for now, p in plans:
        named = Counter(x.job_id for x in p.preemptions)
        assert all(n == 1 for n in named.values()), f"{now}: {p.preemptions}"
    # The plan where the two paths met: the due reservation still preempts j7, and only it does.
    (met,) = [p for now, p in plans if now == 7140.0]
    assert [(x.job_id, x.for_job) for x in met.preemptions] == [("j7", "j4")]
    assert "preempting at-risk job(s) j7" in met.pending_reasons["j4"]
