"""Trace replay: invariants on every cycle, balanced totals, and the engine's own rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.core.types import Placement, Plan, PlanError, Preemption, Snapshot
from scheduling.sim import baselines
from scheduling.sim.cluster import ClusterShape, read_team_weights
from scheduling.sim.engine import Replay
from scheduling.sim.policies import make_policy
from scheduling.sim.replay_types import JobState, Policy, ReplayConfig
from scheduling.sim.trace import TraceJob, load_trace, time_limits

SAMPLE = Path(__file__).parent.parent / "data" / "philly_sep2017_sample2k.csv"
QUOTAS = Path(__file__).parent.parent.parent / "scheduling" / "sim" / "data" / "philly_quotas.csv"


def check_invariants(replay: Replay, plan: Plan) -> None:
    """What must hold after every cycle, whatever the policy decided."""
    seen: dict[str, str] = {}
    for job_id, running in replay.running.items():
        state = replay.states[job_id]
        assert len(running.replicas) == state.replicas, f"{job_id}: gang not whole"
        for replica in running.replicas:
            assert len(replica) == state.per_replica, f"{job_id}: replica of wrong size"
            assert len({replay.gpu_node[g] for g in replica}) == 1, f"{job_id}: replica spans nodes"
            for gpu in replica:
                assert gpu not in seen, f"GPU {gpu} in {seen.get(gpu)} and {job_id}"
                seen[gpu] = job_id
    c = replay.cfg.checkpoint_s
    for running in replay.running.values():
        if not running.terminating:
            k = int((replay.now - running.start) // c)
            assert running.last_checkpoint == (running.start + k * c if k > 0 else None)
    assert seen == replay.owner
    assert replay.busy == len(seen)
    assert not set(replay.pending) & set(replay.running)


def replay_sample(policy: Policy, *, nodes: int = 48, limit: int | None = None, observer: bool = True) -> Replay:
    jobs = load_trace(SAMPLE, limit=limit)
    return Replay(
        jobs,
        policy,
        shape=ClusterShape(nodes=nodes, nodes_per_leaf=16),
        limits=time_limits(jobs, "oracle"),
        team_weights=read_team_weights(QUOTAS),
        config=ReplayConfig(busy_from=0.0, cycle_s=60.0),
        name="test",
        observer=check_invariants if observer else None,
    )


def two_node_starts(jobs: list[TraceJob], policy: Policy) -> dict[str, JobState]:
    """Replay hand-made ``jobs`` of one team on two 8-GPU nodes with oracle limits: job id -> its state."""
    replay = Replay(
        jobs,
        policy,
        shape=ClusterShape(nodes=2),
        limits=time_limits(jobs, "oracle"),
        team_weights={"t": 1.0},
        config=ReplayConfig(busy_from=0.0, cycle_s=60.0),
    )
    return {s.trace.job_id: s for s in replay.run().jobs}


def assert_balanced(replay: Replay) -> None:
    result = replay.run()
    assert not result.unfinished
    expected = sum(s.gpus * s.trace.duration_s + s.lost_gpu_s for s in result.jobs)
    assert result.allocated_gpu_s == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("name", ["fifo", "first-fit", "easy-blind"])
def test_baseline_replay_of_sample_keeps_invariants_and_balances(name: str) -> None:
    assert_balanced(replay_sample(make_policy(name)))


def test_yardmaster_replay_of_sample_keeps_invariants_and_balances() -> None:
    # The real plan() on the real sample; a small cluster so that it queues and preempts.
    replay = replay_sample(make_policy("yardmaster"), nodes=40)
    assert_balanced(replay)
    assert replay.preemptions > 0


def test_plan_using_a_taken_gpu_is_refused() -> None:
    def greedy_twice(snapshot: Snapshot, *, now: float) -> Plan:
        gpus = snapshot.topology.nodes[0].gpus
        placements = tuple(
            Placement(
                job_id=j.job_id,
                replicas=(tuple(g.id for g in gpus[: j.gpus_per_replica]),),
                nodes=("n0000",),
                locality=2,
                leaves=1,
                spines=1,
                borrowed=False,
            )
            for j in snapshot.pending[:2]
            if j.replicas == 1
        )
        return Plan(placements=placements, preemptions=(), reservations=(), pending_reasons={})

    with pytest.raises(PlanError, match="taken"):
        replay_sample(greedy_twice, limit=50, observer=False).run()


def job(job_id: str, submit: float, duration: float, gpus: int, team: str = "t") -> TraceJob:
    return TraceJob(job_id, submit, duration, gpus, team, "u", "completed", "")


def test_preempted_job_loses_work_since_last_checkpoint_and_requeues() -> None:
    """One preemption at t=5,000 with hourly checkpoints: 3,600 s saved, 1,400 + 60 s grace lost."""
    # "b" waits from t=4,000, so cycles run (every wake_s) while "a" runs
    jobs = [job("a", 0.0, 10_000.0, 8), job("b", 4_000.0, 100.0, 8)]
    preempted: list[float] = []

    def preempt_once(snapshot: Snapshot, *, now: float) -> Plan:
        if snapshot.running and not preempted and now >= 5_000:
            preempted.append(now)
            return Plan((), (Preemption(job_id="a", reason="test", grace_s=60.0),), (), {})
        return baselines.fifo(snapshot, now=now)

    replay = Replay(
        jobs,
        preempt_once,
        shape=ClusterShape(nodes=1),
        limits={"a": 10_000.0, "b": 100.0},
        team_weights={"t": 1.0},
        config=ReplayConfig(busy_from=0.0, cycle_s=60.0, wake_s=60.0),
    )
    result = replay.run()
    state = next(s for s in result.jobs if s.trace.job_id == "a")
    assert preempted == [5_040.0]
    assert state.preempted == 1
    assert state.lost_gpu_s == pytest.approx(8 * (5_100.0 - 3_600.0))
    # restarted at the first cycle after the grace period, with 10,000 - 3,600 s of work left
    assert state.finish == pytest.approx(5_100.0 + 6_400.0)


def test_fifo_head_blocks_smaller_jobs_behind_it() -> None:
    jobs = [job("big", 0.0, 1_000.0, 8), job("head", 1.0, 100.0, 16), job("small", 2.0, 100.0, 1)]
    result = two_node_starts(jobs, baselines.fifo)
    assert result["small"].first_start is not None and result["head"].first_start is not None
    assert result["small"].first_start >= result["head"].first_start


def test_easy_backfill_starts_short_job_without_delaying_the_head() -> None:
    jobs = [
        job("big", 0.0, 1_000.0, 8),
        job("head", 1.0, 100.0, 16),
        job("short", 2.0, 500.0, 4),
        job("long", 3.0, 5_000.0, 4),
    ]
    result = two_node_starts(jobs, baselines.easy_backfill)
    assert result["short"].first_start == 60.0
    assert result["head"].first_start == 1_020.0  # the first cycle after "big" ends at 1,000
    assert result["long"].first_start is not None and result["long"].first_start >= 1_020.0 + 100.0


def test_first_fit_partial_gang_holds_gpus_idle_until_its_last_pod_binds() -> None:
    jobs = [job("big", 0.0, 1_000.0, 8), job("gang", 1.0, 100.0, 16), job("later", 2.0, 100.0, 8)]
    policy = baselines.KubeFirstFit(timeout_s=10_000.0)
    result = two_node_starts(jobs, policy)
    # the gang binds one pod on the free node at t=60 and holds it until "big" ends,
    # so "later" (which would have fit there) waits behind it
    assert result["gang"].first_start == 1_020.0
    assert result["later"].first_start == 1_140.0  # first cycle (60 s grid) after the gang ends at 1,120
    assert policy.extra_metrics()["partial_gang_idle_gpu_h"] == pytest.approx(8 * (1_020.0 - 60.0) / 3600)


def test_first_fit_partial_gang_releases_after_timeout() -> None:
    jobs = [job("big", 0.0, 5_000.0, 8), job("gang", 1.0, 100.0, 16), job("later", 2.0, 100.0, 8)]
    policy = baselines.KubeFirstFit(timeout_s=600.0, backoff_s=600.0)
    result = two_node_starts(jobs, policy)
    assert result["later"].first_start == 660.0  # the timed-out gang let go at 60 + 600
    assert policy.extra_metrics()["partial_gang_timeouts"] >= 1
