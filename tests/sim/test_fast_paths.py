"""The replay's shortcuts decide exactly as the plain code they replace: same plans, cycle by cycle."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

import pytest

from scheduling.core.types import PendingJob, Plan, Snapshot, Tier
from scheduling.sim import baselines
from scheduling.sim.cluster import ClusterShape, read_team_weights
from scheduling.sim.engine import Replay
from scheduling.sim.policies import make_policy
from scheduling.sim.replay_types import Policy, ReplayConfig
from scheduling.sim.trace import load_trace, time_limits
from tests.sim.test_replay import QUOTAS, SAMPLE

Placed = tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]
Record = tuple[float, Placed, tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]


def reference_shadow(
    snapshot: Snapshot,
    idx: baselines._Index,
    counts: dict[str, int],
    head: PendingJob,
    started: list[tuple[float, list[str], int]],
    now: float,
    fit_nodes: baselines.FitNodes = baselines._best_fit_nodes,
) -> tuple[float, dict[str, int]]:
    """EASY's shadow time as first written: try the node choice at every end time, nodes looked up afresh."""
    lookup = {g: n for n, gs in idx.gpus.items() for g in gs}
    ends = list(started)
    for r in snapshot.running:
        end = now if r.terminating else r.start + r.time_limit
        ends.append((max(end, now), [lookup[rep[0]] for rep in r.replicas], len(r.replicas[0])))
    ends.sort(key=lambda e: e[0])
    projected = dict(counts)
    i = 0
    while i < len(ends):
        t = ends[i][0]
        while i < len(ends) and ends[i][0] == t:
            _, nodes, per = ends[i]
            for n in nodes:
                if n in projected:
                    projected[n] += per
            i += 1
        trial = dict(projected)
        if fit_nodes(trial, idx, head) is not None:
            return t, trial
    return float("inf"), dict.fromkeys(counts, 0)


def reference_free_gpus(snapshot: Snapshot, idx: baselines._Index) -> dict[str, list[str]]:
    """Free GPUs as first written: every GPU of every node tested on its own."""
    taken = {g for r in snapshot.running for replica in r.replicas for g in replica}
    return {n: [g for g in idx.gpus[n] if g not in taken] for n in idx.names}


def reference_submit_order(pending: Iterable[PendingJob]) -> list[PendingJob]:
    return sorted(pending, key=lambda j: (j.submit_time, j.job_id))


def reversed_tuples(policy: Policy) -> Policy:
    """The policy handed the snapshot's jobs in reverse order: the order it sorts them into must not come
    from the order they arrive in (the sample trace lists jobs that share a submit second by id)."""

    def reordered(snapshot: Snapshot, *, now: float) -> Plan:
        return policy(replace(snapshot, pending=snapshot.pending[::-1], running=snapshot.running[::-1]), now=now)

    return reordered


def plans(name: str, *, slowdown: float, wrap: Callable[[Policy], Policy] = lambda p: p) -> Iterator[Record]:
    jobs = load_trace(SAMPLE, limit=1200)
    out: list[Record] = []

    def record(replay: Replay, plan: Plan) -> None:
        out.append(
            (
                replay.now,
                tuple((p.job_id, p.replicas) for p in plan.placements),
                tuple((r.job_id, r.earliest_start) for r in plan.reservations),
                tuple(sorted(plan.estimated_start.items())),
            )
        )

    # Small and oversubscribed (24 nodes, leaves of 6): reservations and spanning gangs all the time.
    Replay(
        jobs,
        wrap(make_policy(name)),
        shape=ClusterShape(nodes=24, nodes_per_leaf=6, leaves_per_spine=2),
        limits=time_limits(jobs, "estimate"),
        team_weights=read_team_weights(QUOTAS),
        config=ReplayConfig(busy_from=0.0, span_slowdown=slowdown),
        observer=record,
    ).run()
    return iter(out)


@pytest.mark.parametrize("name", ["easy-blind", "easy-topo"])
@pytest.mark.parametrize("slowdown", [0.0, 0.25])
def test_easy_shadow_by_counted_slots_plans_as_trying_every_end_time(
    name: str, slowdown: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = list(plans(name, slowdown=slowdown))
    monkeypatch.setattr(baselines, "_shadow", reference_shadow)
    slow = list(plans(name, slowdown=slowdown))
    assert sum(1 for r in fast if r[2]) > 100, "too few reservations to compare"
    assert sum(1 for r in fast if any(p for _, p in r[1] if len(p) > 1)) > 10, "too few gangs placed to compare"
    assert fast == slow


@pytest.mark.parametrize("name", ["fifo", "first-fit", "easy-blind", "easy-topo"])
def test_free_gpus_and_submit_order_shortcuts_plan_as_the_plain_code(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fast = list(plans(name, slowdown=0.1, wrap=reversed_tuples))
    monkeypatch.setattr(baselines, "free_gpus", reference_free_gpus)
    monkeypatch.setattr(baselines, "_submit_order", reference_submit_order)
    slow = list(plans(name, slowdown=0.1))
    assert sum(1 for r in fast if r[1]) > 200, "too few placements to compare"
    assert fast == slow


def test_submit_order_breaks_ties_by_job_id_whatever_the_order_given() -> None:
    jobs = [
        PendingJob(
            job_id=i, team="t", tier=Tier.RESEARCH, replicas=1, gpus_per_replica=1, gpu_type="P40", submit_time=t, time_limit=1.0
        )
        for i, t in (("b", 5.0), ("c", 1.0), ("a", 5.0), ("d", 0.0))
    ]
    assert [j.job_id for j in baselines._submit_order(jobs)] == ["d", "c", "a", "b"]
    assert baselines._submit_order(jobs) == reference_submit_order(jobs) == baselines._submit_order(jobs[::-1])
