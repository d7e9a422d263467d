"""Checks every plan must pass, shared by the property and the stateful tests."""

from collections import Counter

from scheduling.core.types import Plan, Snapshot, Tier


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
        if p.leaves > 1 and now - job.submit_time < snap.config.leaf_wait_s:
            assert job.replicas > leaf_room(snap, job.gpu_type, job.gpus_per_replica), "a gang that fits one leaf spans leaves"

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

    # Tier 1 only within guarantee (Tier 1 goes first, so its placements alone must fit in it).
    guaranteed = {u.name: u.guaranteed for u in snap.quotas}
    tier1 = {p.job_id: pending[p.job_id].gpu_count for p in result.placements if pending[p.job_id].tier == Tier.PRODUCTION}
    with_tier1 = held_by_unit(snap, tier1)
    for job_id in tier1:
        key = (pending[job_id].team, pending[job_id].gpu_type)
        assert with_tier1[key] <= guaranteed[key[0]].get(key[1], 0), "Tier 1 beyond guarantee"

    # Victims: never Tier 1, never terminating, never younger than min_runtime_s; each once.
    victims = [pr.job_id for pr in result.preemptions]
    assert len(victims) == len(set(victims))
    for job_id in victims:
        job = running[job_id]
        assert job.tier != Tier.PRODUCTION and not job.terminating
        assert now - job.start >= snap.config.min_runtime_s

    # Reservations hold GPUs nobody is placed on, unless that job ends before the reservation starts;
    # and every reserved GPU is free by the reservation's start.
    ends = {j.job_id: j.start + j.time_limit for j in snap.running}
    for v in victims:
        ends[v] = min(ends[v], now + snap.config.grace_period_s)
    for j in snap.running:
        if j.terminating:
            ends[j.job_id] = min(ends[j.job_id], now + snap.config.grace_period_s)
    holder = {g: j.job_id for j in snap.running for r in j.replicas for g in r}
    for res in result.reservations:
        for p in result.placements:
            if set(res.gpus) & {g for r in p.replicas for g in r}:
                assert now + pending[p.job_id].time_limit <= res.earliest_start, "backfill delays a reservation"
        for g in res.gpus:
            if g in holder:
                assert max(ends[holder[g]], now) <= res.earliest_start + 1e-6, "reserved GPU busy past the start"
    reserved = [g for res in result.reservations for g in res.gpus]
    assert len(reserved) == len(set(reserved)), "a GPU in two reservations"
