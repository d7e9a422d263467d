"""Checks every plan must pass, shared by the property and the stateful tests."""

import math
from collections import Counter
from collections.abc import Iterable

from scheduling.core.types import LeafLocality, Plan, Snapshot, Tier


def held_by_unit(snap: Snapshot, extra: dict[str, int] | None = None) -> Counter[tuple[str, str]]:
    """(unit, gpu type) -> GPUs held by running jobs of its teams (plus ``extra`` job_id -> count)."""
    parents = {u.name: u.parent for u in snap.quotas}
    held: Counter[tuple[str, str]] = Counter()

    def add(team: str, gpu_type: str, n: int) -> None:
        name: str | None = team
        seen = set()
        while name is not None and name in parents and name not in seen:
            seen.add(name)
            held[(name, gpu_type)] += n
            name = parents[name]

    for job in snap.running:
        add(job.team, job.gpu_type, job.gpu_count)
    pending = {j.job_id: j for j in snap.pending}
    for job_id, n in (extra or {}).items():
        add(pending[job_id].team, pending[job_id].gpu_type, n)
    return held


def in_one_fabric(snap: Snapshot, node_names: Iterable[str]) -> bool:
    """One node, or nodes all of one (named) fabric domain."""
    fabric = {n.name: n.fabric for n in snap.topology.nodes}
    names = set(node_names)
    return len(names) == 1 or (len({fabric[n] for n in names}) == 1 and fabric[next(iter(names))] != "")


def leaf_room(snap: Snapshot, gpu_type: str, per_replica: int) -> int:
    """Replicas of ``per_replica`` GPUs the READY nodes of the roomiest leaf hold when empty."""
    room: Counter[str] = Counter()
    for n in snap.topology.nodes:
        if n.schedulable and n.gpu_type == gpu_type:
            room[n.leaf] += len(n.gpus) // per_replica
    return max(room.values(), default=0)


def check_plan(snap: Snapshot, result: Plan, now: float) -> None:
    nodes = {n.name: n for n in snap.topology.nodes}
    gpu_node = {g.id: n for n in snap.topology.nodes for g in n.gpus}
    pending = {j.job_id: j for j in snap.pending}
    running = {j.job_id: j for j in snap.running}
    busy = [g for j in snap.running for r in j.replicas for g in r]

    # No GPU in two placements, nor in a placement and a running job.
    placed = [g for p in result.placements for r in p.replicas for g in r]
    assert len(placed) == len(set(placed)), "a GPU placed twice"
    assert not set(placed) & set(busy), "a GPU placed that a running job holds"

    # Every gang whole, each replica on one READY node of the right type.
    for p in result.placements:
        job = pending[p.job_id]
        assert len(p.replicas) == job.replicas == len(p.nodes)
        for replica, node_name in zip(p.replicas, p.nodes, strict=True):
            assert len(replica) == job.gpus_per_replica
            assert {gpu_node[g].name for g in replica} == {node_name}
            assert nodes[node_name].schedulable and nodes[node_name].gpu_type == job.gpu_type
        assert p.leaves == len({nodes[n].leaf for n in p.nodes})
        assert p.spines == len({nodes[n].spine for n in p.nodes})
        # A gang that waits for one leaf whatever the wait costs (``auto`` weighs it: locality.py).
        must_wait = job.locality == LeafLocality.REQUIRED or (
            job.locality == LeafLocality.AUTO and snap.config.span_slowdown == math.inf
        )
        if p.leaves > 1 and now - job.submit_time < snap.config.leaf_wait_s and must_wait:
            assert job.replicas > leaf_room(snap, job.gpu_type, job.gpus_per_replica), "a gang that fits one leaf spans leaves"
        if job.one_fabric:
            assert in_one_fabric(snap, p.nodes), f"one-fabric job {p.job_id} placed on {p.nodes}"
        if job.one_per_node:
            assert len(set(p.nodes)) == len(p.nodes), f"one-per-node job {p.job_id} placed on {p.nodes}"

    # No node given more cores or memory than it has: what its running replicas hold plus what this
    # plan places there (a node that does not say its cores or memory is not held to them).
    cores_used: Counter[str] = Counter()
    memory_used: Counter[str] = Counter()
    placed_on: Counter[str] = Counter()
    for j in snap.running:
        for replica in j.replicas:
            if replica:
                cores_used[gpu_node[replica[0]].name] += j.cpus_per_replica
                memory_used[gpu_node[replica[0]].name] += j.memory_mb_per_replica
    for p in result.placements:
        job = pending[p.job_id]
        for node_name in p.nodes:
            cores_used[node_name] += job.cpus_per_replica
            memory_used[node_name] += job.memory_mb_per_replica
            placed_on[node_name] += job.cpus_per_replica + job.memory_mb_per_replica
    for name in placed_on:
        n = nodes[name]
        if placed_on[name] and n.cpus:
            assert cores_used[name] <= n.cpus, f"node {name} given {cores_used[name]} of {n.cpus} cores"
        if placed_on[name] and n.memory_mb:
            assert memory_used[name] <= n.memory_mb, f"node {name} given {memory_used[name]} of {n.memory_mb} MiB"

    # Every pending job placed or explained, not both.
    placed_ids = {p.job_id for p in result.placements}
    assert len(placed_ids) == len(result.placements)
    assert set(result.pending_reasons) == set(pending) - placed_ids

    # No unit goes above a limit because of this plan.
    before = held_by_unit(snap)
    after = held_by_unit(snap, {p.job_id: pending[p.job_id].gpu_count for p in result.placements})
    for u in snap.quotas:
        for gpu_type, limit in u.limit.items():
            key = (u.name, gpu_type)
            assert after[key] <= max(limit, before[key]), f"{u.name} above its {gpu_type} limit"

    # Tier 1 only within guarantee: the team's Tier 1 work, running and placed, fits in it (the guarantee
    # is claimed in tier order, so the team's Tier 2/3 work does not count against it).
    guaranteed = {u.name: u.guaranteed for u in snap.quotas}
    tier1_held: Counter[tuple[str, str]] = Counter()
    for j in snap.running:
        if j.tier == Tier.PRODUCTION:
            tier1_held[(j.team, j.gpu_type)] += j.gpu_count
    for p in result.placements:
        if pending[p.job_id].tier == Tier.PRODUCTION:
            tier1_held[(pending[p.job_id].team, pending[p.job_id].gpu_type)] += pending[p.job_id].gpu_count
    for p in result.placements:
        job = pending[p.job_id]
        if job.tier == Tier.PRODUCTION:
            key = (job.team, job.gpu_type)
            assert tier1_held[key] <= guaranteed[job.team].get(job.gpu_type, 0), "Tier 1 beyond guarantee"

    # Victims: never Tier 1, never terminating, never younger than min_runtime_s (unless started at risk
    # on reserved GPUs: atrisk.py); each once.
    victims = [pr.job_id for pr in result.preemptions]
    assert len(victims) == len(set(victims))
    for job_id in victims:
        job = running[job_id]
        assert job.tier != Tier.PRODUCTION and not job.terminating
        assert now - job.start >= snap.config.min_runtime_s or job.at_risk

    # Reservations hold GPUs nobody is placed on, unless that job ends before the reservation starts;
    # and every reserved GPU is free by the reservation's start.
    ends = {j.job_id: j.start + j.time_limit for j in snap.running}
    for v in victims:
        ends[v] = min(ends[v], now + snap.config.grace_period_s)
    for j in snap.running:
        if j.terminating or (j.at_risk and j.tier != Tier.PRODUCTION):  # at risk: goes when a reservation needs it
            ends[j.job_id] = min(ends[j.job_id], now + snap.config.grace_period_s)
    holder = {g: j.job_id for j in snap.running for r in j.replicas for g in r}
    for res in result.reservations:
        for p in result.placements:
            if set(res.gpus) & {g for r in p.replicas for g in r} and not p.at_risk:
                assert now + pending[p.job_id].time_limit <= res.earliest_start, "backfill delays a reservation"
        for g in res.gpus:
            if g in holder:
                assert max(ends[holder[g]], now) <= res.earliest_start + 1e-6, "reserved GPU busy past the start"
    reserved = [g for res in result.reservations for g in res.gpus]
    assert len(reserved) == len(set(reserved)), "a GPU in two reservations"
    # A reservation (backfill's or a reclaim's) for a one-fabric job holds GPUs of one fabric domain.
    for res in result.reservations:
        if res.job_id in pending and pending[res.job_id].one_fabric and res.gpus:
            assert in_one_fabric(snap, [gpu_node[g].name for g in res.gpus]), f"one-fabric reservation {res}"
    # ... and one for a one-per-node job at most one replica's GPUs on each node.
    for res in result.reservations:
        job = pending.get(res.job_id)
        if job is not None and job.one_per_node and res.gpus:
            per_node = Counter(gpu_node[g].name for g in res.gpus)
            assert max(per_node.values()) <= job.gpus_per_replica, f"one-per-node reservation {res}"
