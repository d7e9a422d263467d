"""Hypothesis strategies: random clusters, quota trees and consistent job mixes."""

import math

from hypothesis import strategies as st

from scheduling.core.testing import cluster, merge
from scheduling.core.types import (
    Config,
    LeafLocality,
    Node,
    PendingJob,
    QuotaUnit,
    RunningJob,
    Snapshot,
    Tier,
    Topology,
)

TEAMS = ("t0", "t1", "t2", "t3")
NOW = 100_000.0


@st.composite
def topologies(draw: st.DrawFn) -> Topology:
    main = cluster(
        nodes_per_leaf=draw(st.integers(1, 4)),
        leaves_per_spine=draw(st.integers(1, 3)),
        spines=draw(st.integers(1, 2)),
        gpus_per_node=draw(st.sampled_from([4, 8])),
        nvlink_domains=draw(st.sampled_from([1, 2])),
    )
    parts = [main]
    if draw(st.booleans()):
        parts.append(cluster(nodes_per_leaf=draw(st.integers(1, 3)), gpu_type="A100", prefix="a"))
    topo = merge(*parts)
    down = draw(st.sets(st.sampled_from([n.name for n in topo.nodes]), max_size=2))
    # Often nodes say their cores and memory (some, or all), so that they bind; sometimes none do.
    sized = draw(st.sampled_from(["none", "all", "some"]))
    cores = draw(st.sampled_from([8, 32, 112]))
    memory = draw(st.sampled_from([64 * 1024, 1024 * 1024]))

    def says(name: str) -> bool:
        return sized == "all" or (sized == "some" and int(name[-1]) % 2 == 0)

    # Sometimes multi-node NVLink domains: consecutive nodes of a leaf in groups (0: none).
    group = draw(st.sampled_from([0, 0, 2, 3]))
    fabric: dict[str, str] = {}
    if group:
        at: dict[str, int] = {}
        for n in topo.nodes:
            i = at[n.leaf] = at.get(n.leaf, -1) + 1
            fabric[n.name] = f"{n.leaf}/nvl{i // group}"

    return Topology(
        nodes=tuple(
            Node(
                n.name,
                n.leaf,
                n.spine,
                n.gpu_type,
                n.gpus,
                schedulable=n.name not in down,
                cpus=cores if says(n.name) else 0,
                memory_mb=memory if says(n.name) else 0,
                fabric=fabric.get(n.name, ""),
            )
            for n in topo.nodes
        )
    )


# Per replica: mostly nothing or a little, sometimes a lot (more than a node's share for its GPUs).
asks_cpus = st.sampled_from([0, 0, 1, 4, 16, 48])
asks_memory = st.sampled_from([0, 0, 1024, 16 * 1024, 48 * 1024])


@st.composite
def quota_trees(draw: st.DrawFn) -> tuple[QuotaUnit, ...]:
    def amounts(max_value: int) -> dict[str, int]:
        return draw(st.dictionaries(st.sampled_from(["H100", "A100"]), st.integers(0, max_value), max_size=2))

    units = [QuotaUnit("root", None), QuotaUnit("d0", "root", limit=amounts(64)), QuotaUnit("d1", "root")]
    for i, team in enumerate(TEAMS):
        units.append(
            QuotaUnit(
                team,
                "d0" if i < 2 else "d1",
                guaranteed=amounts(24),
                limit=amounts(48) if draw(st.booleans()) else {},
                usage={"H100": draw(st.floats(0, 1e6)), "A100": draw(st.floats(0, 1e6))},
                weight=draw(st.sampled_from([0.5, 1.0, 2.0])),
            )
        )
    return tuple(units)


shapes = st.tuples(st.integers(1, 4), st.sampled_from([1, 2, 4, 8]))
tiers = st.sampled_from(list(Tier))


@st.composite
def running_jobs(draw: st.DrawFn, topo: Topology, count: int) -> tuple[RunningJob, ...]:
    """Running gangs on disjoint GPUs: each replica on the free GPUs of one node."""
    free = {n.name: [g.id for g in n.gpus] for n in topo.nodes}
    types = {n.name: n.gpu_type for n in topo.nodes}
    # Cores and memory left on each node (unbounded where the node does not say): running work fits.
    cores = {n.name: n.cpus or math.inf for n in topo.nodes}
    memory = {n.name: n.memory_mb or math.inf for n in topo.nodes}
    out = []
    for i in range(count):
        replicas, per = draw(shapes)
        c, m = draw(asks_cpus), draw(asks_memory)
        gpu_type = draw(st.sampled_from(sorted(set(types.values()))))
        reps = []
        for _ in range(replicas):
            fitting = sorted(
                n for n, ids in free.items() if len(ids) >= per and types[n] == gpu_type and cores[n] >= c and memory[n] >= m
            )
            if not fitting:
                break
            node_name = draw(st.sampled_from(fitting))
            reps.append(tuple(free[node_name][:per]))
            free[node_name] = free[node_name][per:]
            cores[node_name] -= c
            memory[node_name] -= m
        if not reps:
            continue
        start = draw(st.floats(NOW - 50_000, NOW))
        out.append(
            RunningJob(
                job_id=f"r{i}",
                team=draw(st.sampled_from(TEAMS)),
                tier=draw(tiers),
                gpu_type=gpu_type,
                replicas=tuple(reps),
                start=start,
                time_limit=draw(st.floats(60, 100_000)),
                last_checkpoint=draw(st.none() | st.floats(start, NOW)),
                terminating=draw(st.booleans()) and draw(st.booleans()),
                at_risk=draw(st.booleans()) and draw(st.booleans()),
                cpus_per_replica=c,
                memory_mb_per_replica=m,
            )
        )
    return tuple(out)


def pending_job(job_id: str, draw: st.DrawFn) -> PendingJob:
    replicas, per = draw(shapes)
    return PendingJob(
        job_id=job_id,
        team=draw(st.sampled_from(TEAMS)),
        tier=draw(tiers),
        replicas=replicas,
        gpus_per_replica=per,
        gpu_type=draw(st.sampled_from(["H100", "H100", "A100"])),
        submit_time=draw(st.floats(0, NOW)),
        time_limit=draw(st.floats(60, 100_000)),
        priority=draw(st.integers(0, 2)),
        locality=draw(st.sampled_from([LeafLocality.AUTO, LeafLocality.AUTO, LeafLocality.REQUIRED, LeafLocality.PREFERRED])),
        cpus_per_replica=draw(asks_cpus),
        memory_mb_per_replica=draw(asks_memory),
        one_fabric=draw(st.booleans()) and draw(st.booleans()),
        one_per_node=draw(st.booleans()) and draw(st.booleans()),
    )


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    topo = draw(topologies())
    busy = draw(running_jobs(topo, draw(st.integers(0, 12))))
    waiting = tuple(pending_job(f"p{i}", draw) for i in range(draw(st.integers(0, 12))))
    config = Config(
        max_reservations=draw(st.integers(1, 2)),
        backfill=draw(st.booleans()) or draw(st.booleans()),
        preemption=draw(st.booleans()) or draw(st.booleans()),
        # Mostly the strict default; sometimes a bound, so that both sides of it are exercised.
        leaf_wait_s=draw(st.sampled_from([math.inf, math.inf, 0.0, 50_000.0])),
        span_slowdown=draw(st.sampled_from([0.25, 0.25, math.inf, 0.0])),
        backfill_at_risk=draw(st.booleans()),
    )
    return Snapshot(topo, busy, waiting, draw(quota_trees()), config)
