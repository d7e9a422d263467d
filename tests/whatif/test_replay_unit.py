"""The what-if's door into the replay engine, without a database: the real fleet (leaves of any size,
nodes of any GPU count), the real tree and tiers given to plan(), fair-share usage split by GPU type."""

from __future__ import annotations

import pytest

from scheduling.core.types import Config, Gpu, Node, QuotaUnit, RunningJob, Tier, Topology
from scheduling.whatif.replay import Cancelled, ReplayJob, _engine_shape, _TreePolicy, replay_tree


def _node(name: str, leaf: str, gpu_type: str, gpus: int) -> Node:
    return Node(
        name=name,
        leaf=leaf,
        spine="spine-1",
        gpu_type=gpu_type,
        gpus=tuple(
            Gpu(id=f"{name}-g{k}", index=k, nvlink=f"{name}/nvl", pcie=f"{name}/p", numa=f"{name}/n") for k in range(gpus)
        ),
    )


FLEET = Topology(
    nodes=(
        _node("b-1", "leaf-a", "H100", 8),
        _node("a-1", "leaf-b", "H100", 8),
        _node("c-1", "leaf-a", "A100", 4),  # a smaller node: its extra engine GPUs are never offered
    )
)
TREE = (
    QuotaUnit("root", None, guaranteed={"H100": 16, "A100": 4}),
    QuotaUnit("team-x", "root", guaranteed={"H100": 8, "A100": 4}),
    QuotaUnit("team-y", "root", guaranteed={"H100": 8}),
)


def _job(
    job_id: str, team: str, *, gpu_type: str = "H100", gpus: int = 8, at: float = 0.0, run: float = 3600.0, tier: int = 2
) -> ReplayJob:
    return ReplayJob(job_id, team, tier, gpu_type, 1, gpus, at, run, 2 * run)


def test_the_engine_cluster_maps_every_real_gpu_to_one_engine_gpu_and_back() -> None:
    shape, order = _engine_shape(FLEET)
    assert shape.gpus_per_node == 8 and shape.gpu_types == (("A100", 1), ("H100", 2))
    policy = _TreePolicy(FLEET, shape, order, TREE, [])
    assert len(policy.to_real) == 20 and set(policy.to_real.values()) == {g.id for n in FLEET.nodes for g in n.gpus}
    assert all(policy.to_engine[real] == engine for engine, real in policy.to_real.items())


def test_jobs_run_on_the_real_fleet_and_a_gang_too_big_for_its_type_waits_for_ever() -> None:
    jobs = [
        _job("1", "team-x"),
        _job("2", "team-y"),
        _job("3", "team-x", gpu_type="A100", gpus=4),
        _job("4", "team-y", at=60.0),  # waits for job 1 or 2
        _job("5", "team-x", gpu_type="A100", gpus=8, at=60.0),  # the 4-GPU node cannot hold it
    ]
    out = replay_tree(jobs=jobs, fleet=FLEET, quotas=TREE, config=Config(), cycle_s=5.0)
    assert out.total_gpus == 20
    assert out.jobs["1"].wait_s is not None and out.jobs["1"].wait_s < 10
    assert out.jobs["3"].jct_s is not None
    assert out.jobs["4"].wait_s is not None and out.jobs["4"].wait_s >= 3600 - 60
    assert out.jobs["5"].wait_s is None and out.jobs["5"].jct_s is None


def test_a_tier_1_job_beyond_its_teams_guarantee_is_not_admitted() -> None:
    jobs = [_job("1", "team-y", gpus=8, tier=1), _job("2", "team-y", gpus=8, tier=1, at=1.0)]
    out = replay_tree(jobs=jobs, fleet=FLEET, quotas=TREE, config=Config(), cycle_s=5.0)
    # team-y is guaranteed 8 H100: its second Tier 1 job waits for the first though 8 H100 are idle.
    assert out.jobs["2"].wait_s is not None and out.jobs["2"].wait_s >= 3600 - 5


def test_fair_share_usage_is_split_over_gpu_types_as_the_team_held_them() -> None:
    shape, order = _engine_shape(FLEET)
    policy = _TreePolicy(FLEET, shape, order, TREE, [])
    a100 = tuple(g.id for g in FLEET.nodes[2].gpus)
    running = RunningJob("9", "team-x", Tier.RESEARCH, "A100", (a100,), start=0.0, time_limit=7200.0)
    policy._tree(TREE, 0.0, 7 * 86400)
    policy._hold([running], [])
    engine_usage = (QuotaUnit("cluster", None), QuotaUnit("team-x", "cluster", usage={"A100": 3600.0 * 4}))
    tree = {u.name: u for u in policy._tree(engine_usage, 3600.0, 7 * 86400)}
    assert tree["team-x"].usage == {"A100": pytest.approx(3600.0 * 4)}
    assert tree["team-y"].usage == {}


def test_a_replay_stops_when_its_progress_callback_cancels_it() -> None:
    calls: list[float] = []

    def progress(fraction: float) -> None:
        calls.append(fraction)
        raise Cancelled

    with pytest.raises(Cancelled):
        replay_tree(
            jobs=[_job("1", "team-x"), _job("2", "team-y", at=10.0)],
            fleet=FLEET,
            quotas=TREE,
            config=Config(),
            cycle_s=5.0,
            progress=progress,
        )
    assert len(calls) == 1


def test_fair_share_remembers_the_usage_before_the_window() -> None:
    one_node = Topology(nodes=(_node("a-1", "leaf-a", "H100", 8),))
    tree = (
        QuotaUnit("root", None, guaranteed={"H100": 8}),
        QuotaUnit("team-x", "root", guaranteed={"H100": 4}),
        QuotaUnit("team-y", "root", guaranteed={"H100": 4}),
    )
    jobs = [_job("1", "team-x"), _job("2", "team-y")]
    fresh = replay_tree(jobs=jobs, fleet=one_node, quotas=tree, config=Config(), cycle_s=5.0)
    assert fresh.jobs["1"].wait_s == pytest.approx(0.0, abs=5)  # equal standing: the first submitted first
    heavy_x = {"team-x": {"H100": 8 * 86400.0}}
    remembered = replay_tree(jobs=jobs, fleet=one_node, quotas=tree, config=Config(), cycle_s=5.0, initial_usage=heavy_x)
    assert remembered.jobs["2"].wait_s == pytest.approx(0.0, abs=5)  # team-x used the node all day before
    assert remembered.jobs["1"].wait_s is not None and remembered.jobs["1"].wait_s >= 3600


def test_jobs_are_held_to_their_nodes_cores_as_the_cycle_holds_them() -> None:
    from dataclasses import replace

    small = Topology(nodes=(replace(_node("a-1", "leaf-a", "H100", 8), cpus=20),))
    tree = (QuotaUnit("root", None, guaranteed={"H100": 8}), QuotaUnit("team-x", "root", guaranteed={"H100": 8}))
    jobs = [replace(_job(str(i), "team-x", gpus=4), cpus_per_replica=16) for i in (1, 2)]
    out = replay_tree(jobs=jobs, fleet=small, quotas=tree, config=Config(), cycle_s=5.0)
    # Four GPUs stay free, but not the 16 cores the second job asks for: it waits for the first.
    assert out.jobs["2"].wait_s is not None and out.jobs["2"].wait_s >= 3600 - 5
