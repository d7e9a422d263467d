"""What topology costs in the replay, the switch-aware EASY baseline, backfill at risk, the gang-heavy workload."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduling.core.plan import plan
from scheduling.core.types import Config, Locality, PendingJob, Placement, Plan, Preemption, RunningJob, Snapshot, Tier
from scheduling.sim import baselines
from scheduling.sim.cluster import ClusterShape, build_topology
from scheduling.sim.engine import Replay
from scheduling.sim.policies import make_policy
from scheduling.sim.replay_types import JobState, Policy, ReplayConfig
from scheduling.sim.trace import TraceJob, time_limits
from scheduling.sim.workload import GangHeavy, gang_gpu_share, gang_heavy
from tests.sim.test_replay import assert_balanced, check_invariants, replay_sample

# Two leaves of two 8-GPU nodes: leaf-0 = n0000, n0001; leaf-1 = n0002, n0003.
SMALL = ClusterShape(nodes=4, nodes_per_leaf=2)


def job(job_id: str, submit: float, duration: float, gpus: int) -> TraceJob:
    return TraceJob(job_id, submit, duration, gpus, "t", "u", "completed", "")


def on_nodes(nodes: dict[str, tuple[str, ...]]) -> Policy:
    """A policy that puts each named pending job's replicas, whole nodes, on the given nodes."""

    def policy(snapshot: Snapshot, *, now: float) -> Plan:
        out = []
        for j in snapshot.pending:
            if j.job_id in nodes:
                names = nodes[j.job_id]
                replicas = tuple(tuple(f"{n}/{g}" for g in range(j.gpus_per_replica)) for n in names)
                out.append(Placement(j.job_id, replicas, names, Locality.LEAF, 1, 1, borrowed=False))
        return Plan(tuple(out), (), (), {j.job_id: "" for j in snapshot.pending if j.job_id not in nodes})

    return policy


def small_replay(jobs: list[TraceJob], policy: Policy, *, slowdown: float, **cfg: float) -> Replay:
    return Replay(
        jobs,
        policy,
        shape=SMALL,
        limits=time_limits(jobs, "oracle"),
        team_weights={"t": 1.0},
        config=ReplayConfig(busy_from=0.0, cycle_s=60.0, span_slowdown=slowdown, **cfg),  # type: ignore[arg-type]
    )


def replay(jobs: list[TraceJob], policy: Policy, *, slowdown: float, **cfg: float) -> dict[str, JobState]:
    return {s.trace.job_id: s for s in small_replay(jobs, policy, slowdown=slowdown, **cfg).run().jobs}


def test_a_gang_across_leaves_runs_longer_by_the_slowdown_factor() -> None:
    done = replay([job("g", 0.0, 10_000.0, 16)], on_nodes({"g": ("n0001", "n0002")}), slowdown=0.25)
    assert done["g"].finish == pytest.approx(12_500.0)  # placed at the first cycle, t = 0
    assert done["g"].slowed == 1


def test_a_gang_inside_one_leaf_runs_at_full_speed() -> None:
    done = replay([job("g", 0.0, 10_000.0, 16)], on_nodes({"g": ("n0000", "n0001")}), slowdown=0.25)
    assert done["g"].finish == pytest.approx(10_000.0)
    assert done["g"].slowed == 0


def test_without_a_slowdown_spanning_costs_nothing() -> None:
    done = replay([job("g", 0.0, 10_000.0, 16)], on_nodes({"g": ("n0001", "n0002")}), slowdown=0.0)
    assert done["g"].finish == pytest.approx(10_000.0)


def test_a_preempted_slowed_gang_keeps_the_work_its_checkpoints_saved() -> None:
    """Across leaves at 25 %: 7,200 s of run time checkpointed twice, saving 2 x 3,600 / 1.25 s of work."""
    placed: list[float] = []

    def preempt_later(snapshot: Snapshot, *, now: float) -> Plan:
        running = {r.job_id: r for r in snapshot.running}
        if "g" in running and not running["g"].terminating and now - running["g"].start >= 7_500.0 and not placed:
            placed.append(now)
            return Plan((), (Preemption("g", "test", 60.0),), (), {"w": ""})
        return on_nodes({"g": ("n0001", "n0002")})(snapshot, now=now)

    jobs = [job("g", 0.0, 10_000.0, 16), job("w", 100.0, 10.0, 32)]  # "w" never fits: cycles keep running
    r = small_replay(jobs, preempt_later, slowdown=0.25, wake_s=60.0)
    r.run()
    g = r.states["g"]
    saved = 2 * 3600.0 / 1.25
    assert g.preempted == 1
    # It ran from t = 0 to the end of its 60 s grace; its two checkpoints kept the first 7,200 s of that.
    assert g.lost_gpu_s == pytest.approx(16 * (placed[0] + 60.0 - 7_200.0))
    assert g.slow_gpu_s >= 16 * saved * 0.25


def test_allocated_gpu_time_balances_with_slowdown_and_preemption() -> None:
    replay_ = replay_sample(make_policy("yardmaster"), nodes=40)
    replay_.cfg = replace(replay_.cfg, span_slowdown=0.25, core=replace(replay_.cfg.core, span_slowdown=0.25))
    result = replay_.run()
    assert not result.unfinished
    expected = sum(s.gpus * s.trace.duration_s + s.lost_gpu_s + s.slow_gpu_s for s in result.jobs)
    assert result.allocated_gpu_s == pytest.approx(expected, rel=1e-9)
    assert sum(s.slowed for s in result.jobs) > 0


def test_switch_aware_easy_keeps_a_gang_in_one_leaf_where_plain_easy_spans() -> None:
    # Two 4-GPU jobs fill n0000; best fit then puts a 2 x 8 gang on n0001 and n0002 (name order, across
    # leaves) unless it looks at switches: leaf-1 has both its nodes free.
    jobs = [job("a", 0.0, 50_000.0, 4), job("b", 0.0, 50_000.0, 4), job("g", 10.0, 1_000.0, 16)]

    def leaves_of_g(policy: Policy) -> int:
        r = Replay(jobs, policy, shape=SMALL, limits=time_limits(jobs, "oracle"), team_weights={"t": 1.0})
        (p,) = [p for p in r.run().placements if p.job_id == "g"]
        return p.leaves

    assert leaves_of_g(baselines.easy_backfill) == 2
    assert leaves_of_g(baselines.easy_backfill_topo) == 1


def test_switch_aware_fit_takes_the_fullest_leaf_that_still_holds_the_gang() -> None:
    idx = baselines._index(build_topology(ClusterShape(nodes=48, nodes_per_leaf=16)))
    counts = dict.fromkeys(idx.names, 8)
    for n in idx.names[16:29]:  # leaf-1 keeps 3 free nodes; leaf-0 and leaf-2 all 16
        counts[n] = 0
    gang = PendingJob("g", "t", Tier.RESEARCH, 2, 8, "P40", 0.0, 3600.0)
    nodes = baselines._switch_fit_nodes(counts, idx, gang)
    assert nodes is not None and {idx.leaf[n] for n in nodes} == {"leaf-1"}
    assert counts[nodes[0]] == 0  # taken only on success, and then taken


def test_switch_aware_fit_spans_the_fewest_leaves_when_no_leaf_holds_the_gang() -> None:
    idx = baselines._index(build_topology(ClusterShape(nodes=48, nodes_per_leaf=16)))
    counts = dict.fromkeys(idx.names, 0)
    for n in [*idx.names[0:2], *idx.names[16:20], *idx.names[32:33]]:  # 2, 4 and 1 free nodes
        counts[n] = 8
    gang = PendingJob("g", "t", Tier.RESEARCH, 5, 8, "P40", 0.0, 3600.0)
    nodes = baselines._switch_fit_nodes(counts, idx, gang)
    # Two leaves, no fewer: the roomiest (leaf-1, 4 nodes), then the tightest that holds the last replica
    # (leaf-2's one node, not leaf-0's two), so leaf-0 stays whole for the next 2-node gang.
    assert nodes is not None and sorted({idx.leaf[n] for n in nodes}) == ["leaf-1", "leaf-2"]


def test_replay_with_backfill_at_risk_keeps_invariants_and_balances() -> None:
    r = replay_sample(make_policy("yardmaster"), nodes=40)
    r.cfg = replace(r.cfg, core=replace(r.cfg.core, backfill_at_risk=True))
    seen: list[bool] = []

    def observe(rep: Replay, plan: Plan) -> None:
        check_invariants(rep, plan)
        seen.extend(rj.at_risk for rj in rep.running.values())

    r.observer = observe
    assert_balanced(r)
    assert any(seen), "no job ever ran at risk"


def test_gang_heavy_workload_is_seeded() -> None:
    small = GangHeavy(jobs=500)
    assert gang_heavy(small) == gang_heavy(small)
    assert gang_heavy(small) != gang_heavy(replace(small, seed=small.seed + 1))


def test_gang_heavy_workload_gives_most_gpu_time_to_multi_node_gangs() -> None:
    jobs = gang_heavy()
    assert len(jobs) == 11_000
    assert gang_gpu_share(jobs, 8) >= 0.60
    assert [(j.submit_time, j.job_id) for j in jobs] == sorted((j.submit_time, j.job_id) for j in jobs)
    offered = sum(j.num_gpus * j.duration_s for j in jobs) / (800 * jobs[-1].submit_time)
    assert 0.75 <= offered <= 0.95


def test_a_configured_variant_is_plan_under_that_setting() -> None:
    jobs = [job("a", 0.0, 3600.0, 8), job("b", 0.0, 3600.0, 8), job("g", 0.0, 36_000.0, 16)]
    snap = Snapshot(
        topology=build_topology(SMALL),
        running=(
            RunningJob("a", "t", Tier.RESEARCH, "P40", (tuple(f"n0000/{i}" for i in range(8)),), 0.0, 3600.0),
            RunningJob("b", "t", Tier.RESEARCH, "P40", (tuple(f"n0002/{i}" for i in range(8)),), 0.0, 3600.0),
        ),
        pending=(PendingJob("g", "t", Tier.RESEARCH, 2, 8, "P40", 0.0, 600.0),),
        quotas=Replay(jobs, baselines.fifo, shape=SMALL, limits=time_limits(jobs, "oracle"), team_weights={"t": 1.0}).quotas(),
    )
    assert make_policy("yardmaster")(snap, now=0.0).placements  # spanning costs 25 % of 10 min: less than the hour's wait
    required = make_policy("yardmaster-required")(snap, now=0.0)
    assert required == plan(replace(snap, config=Config(span_slowdown=float("inf"))), now=0.0)
    assert required.placements == ()


def test_a_slowed_gang_is_given_a_limit_stretched_as_its_run_is() -> None:
    """A policy reads the running gang's limit to plan around it: a slowed gang's own (oracle) limit would
    run out at 10,000 s while the gang runs to 12,500 s, and a backfill would count it as ending "now"."""
    seen: list[float] = []
    place = on_nodes({"g": ("n0001", "n0002"), "h": ("n0000",)})

    def policy(snapshot: Snapshot, *, now: float) -> Plan:
        seen.extend(r.time_limit for r in snapshot.running if r.job_id == "g")
        return place(snapshot, now=now)

    replay([job("g", 0.0, 10_000.0, 16), job("h", 600.0, 60.0, 8)], policy, slowdown=0.25)
    assert seen and all(limit == pytest.approx(12_500.0) for limit in seen)


def test_the_replay_cycles_as_often_as_the_deployment_by_default() -> None:
    import os
    from pathlib import Path

    from portal.yard_settings import yard_settings

    if "YARD_CYCLE_INTERVAL_S" in os.environ:
        pytest.skip("the environment sets the interval")
    assert ReplayConfig().cycle_s == yard_settings(Path("/nonexistent"))["CYCLE_INTERVAL_S"]


def test_an_event_driven_replay_plans_at_each_arrival_and_departure() -> None:
    jobs = [job("a", 7.0, 100.0, 8), job("b", 31.0, 50.0, 8)]
    one_node = on_nodes({"a": ("n0000",), "b": ("n0000",)})

    def policy(snapshot: Snapshot, *, now: float) -> Plan:  # one job at a time on n0000
        if snapshot.running:
            return Plan((), (), (), {j.job_id: "n0000 is busy" for j in snapshot.pending})
        return one_node(replace(snapshot, pending=snapshot.pending[:1]), now=now)

    r = Replay(
        jobs,
        policy,
        shape=SMALL,
        limits=time_limits(jobs, "oracle"),
        team_weights={"t": 1.0},
        config=ReplayConfig(busy_from=0.0, cycle_s=0.0),
    )
    done = {s.trace.job_id: s for s in r.run().jobs}
    # a starts as it arrives; b waits for a's node, and starts the moment a ends (t = 107).
    assert done["a"].first_start == 7.0 and done["b"].first_start == 107.0


def test_the_replay_plans_with_the_deployments_settings_but_what_it_measures() -> None:
    # Backfill at risk was on in the replay alone (90 % of its preemptions) while the portal leaves it off.
    from scheduling.selectors.config import scheduler_config
    from scheduling.sim import cli

    args = cli.parser().parse_args([])
    task = cli.tasks(args)[0]
    core = cli.replay_config(task).core
    deployed = scheduler_config()
    assert core.backfill_at_risk is deployed.backfill_at_risk is False
    assert core.grace_period_s == deployed.grace_period_s
    assert cli.replay_config(replace(task, args=cli.parser().parse_args(["--at-risk"]))).core.backfill_at_risk
