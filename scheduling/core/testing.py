"""Builders for small hand-drawn clusters and jobs, for tests, benchmarks and the simulator.

``cluster(nodes_per_leaf=4, leaves_per_spine=2, spines=1)`` is a cluster of 8-GPU nodes laid
out like an HGX H100 box: the 8 GPUs share one NVLink domain and sit under two PCIe switches
and two NUMA nodes (GPUs 0-3 and 4-7). Names are stable: spine-0, leaf-0, leaf-1, ... (leaves
numbered across the cluster), nodes n000, n001, ...; GPU ids "n000/0".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduling.core.types import Config, Gpu, Node, PendingJob, QuotaUnit, RunningJob, Snapshot, Tier, Topology


def node(
    name: str,
    *,
    leaf: str = "leaf-0",
    spine: str = "spine-0",
    gpus: int = 8,
    gpu_type: str = "H100",
    nvlink_domains: int = 1,
    pcie_switches: int = 2,
    numa_nodes: int = 2,
    schedulable: bool = True,
    cpus: int = 0,
    memory_mb: int = 0,
) -> Node:
    """One node; GPUs are split evenly, in index order, over its NVLink domains, PCIe switches, NUMA nodes."""

    def part(i: int, parts: int) -> int:
        return i * parts // gpus

    return Node(
        name=name,
        leaf=leaf,
        spine=spine,
        gpu_type=gpu_type,
        gpus=tuple(
            Gpu(
                id=f"{name}/{i}",
                index=i,
                nvlink=f"{name}/nvl{part(i, nvlink_domains)}",
                pcie=f"{name}/pcie{part(i, pcie_switches)}",
                numa=f"{name}/numa{part(i, numa_nodes)}",
            )
            for i in range(gpus)
        ),
        schedulable=schedulable,
        cpus=cpus,
        memory_mb=memory_mb,
    )


def cluster(
    *,
    nodes_per_leaf: int = 4,
    leaves_per_spine: int = 1,
    spines: int = 1,
    gpus_per_node: int = 8,
    gpu_type: str = "H100",
    nvlink_domains: int = 1,
    pcie_switches: int = 2,
    numa_nodes: int = 2,
    prefix: str = "",
    cpus: int = 0,
    memory_mb: int = 0,
) -> Topology:
    """A regular cluster: spines x leaves_per_spine x nodes_per_leaf nodes of one GPU type."""
    nodes: list[Node] = []
    for s in range(spines):
        for lf in range(leaves_per_spine):
            leaf_no = s * leaves_per_spine + lf
            for n in range(nodes_per_leaf):
                nodes.append(
                    node(
                        f"{prefix}n{leaf_no * nodes_per_leaf + n:03d}",
                        leaf=f"{prefix}leaf-{leaf_no}",
                        spine=f"{prefix}spine-{s}",
                        gpus=gpus_per_node,
                        gpu_type=gpu_type,
                        nvlink_domains=nvlink_domains,
                        pcie_switches=pcie_switches,
                        numa_nodes=numa_nodes,
                        cpus=cpus,
                        memory_mb=memory_mb,
                    )
                )
    return Topology(nodes=tuple(nodes))


def merge(*topologies: Topology) -> Topology:
    """One cluster from several (use distinct ``prefix`` values), e.g. an H100 and an A100 pool."""
    return Topology(nodes=tuple(n for t in topologies for n in t.nodes))


def gpu_ids(topology: Topology, node_name: str, indexes: Sequence[int] | None = None) -> tuple[str, ...]:
    """The ids of some (default: all) GPUs of one node."""
    for n in topology.nodes:
        if n.name == node_name:
            return tuple(g.id for g in n.gpus if indexes is None or g.index in indexes)
    raise KeyError(node_name)


def running(
    job_id: str,
    replicas: Sequence[Sequence[str]],
    *,
    team: str = "team-a",
    tier: Tier = Tier.RESEARCH,
    gpu_type: str = "H100",
    start: float = 0.0,
    time_limit: float = 3600.0,
    last_checkpoint: float | None = None,
    terminating: bool = False,
    cpus: int = 0,
    memory_mb: int = 0,
) -> RunningJob:
    return RunningJob(
        job_id=job_id,
        team=team,
        tier=tier,
        gpu_type=gpu_type,
        replicas=tuple(tuple(r) for r in replicas),
        start=start,
        time_limit=time_limit,
        last_checkpoint=last_checkpoint,
        terminating=terminating,
        cpus_per_replica=cpus,
        memory_mb_per_replica=memory_mb,
    )


def pending(
    job_id: str,
    replicas: int = 1,
    gpus_per_replica: int = 8,
    *,
    team: str = "team-a",
    tier: Tier = Tier.RESEARCH,
    gpu_type: str = "H100",
    submit_time: float = 0.0,
    time_limit: float = 3600.0,
    priority: int = 0,
    cpus: int = 0,
    memory_mb: int = 0,
) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        team=team,
        tier=tier,
        replicas=replicas,
        gpus_per_replica=gpus_per_replica,
        gpu_type=gpu_type,
        submit_time=submit_time,
        time_limit=time_limit,
        priority=priority,
        cpus_per_replica=cpus,
        memory_mb_per_replica=memory_mb,
    )


def quota_tree(
    teams: Mapping[str, Mapping[str, int]],
    *,
    limits: Mapping[str, Mapping[str, int]] | None = None,
    usage: Mapping[str, Mapping[str, float]] | None = None,
    root: str = "root",
) -> tuple[QuotaUnit, ...]:
    """A flat tree: a root and one team per entry of ``teams`` (team -> guaranteed GPUs per type)."""
    limits = limits or {}
    usage = usage or {}
    units = [QuotaUnit(name=root, parent=None, limit=dict(limits.get(root, {})))]
    for name in sorted(teams):
        units.append(
            QuotaUnit(
                name=name,
                parent=root,
                guaranteed=dict(teams[name]),
                limit=dict(limits.get(name, {})),
                usage=dict(usage.get(name, {})),
            )
        )
    return tuple(units)


def snapshot(
    topology: Topology,
    *,
    running: Sequence[RunningJob] = (),
    pending: Sequence[PendingJob] = (),
    quotas: Sequence[QuotaUnit] | None = None,
    config: Config | None = None,
) -> Snapshot:
    """A snapshot; without ``quotas`` every team seen gets the whole cluster as its guarantee."""
    if quotas is None:
        totals: dict[str, int] = {}
        for n in topology.nodes:
            totals[n.gpu_type] = totals.get(n.gpu_type, 0) + len(n.gpus)
        teams = {j.team for j in running} | {j.team for j in pending}
        quotas = quota_tree({t: totals for t in teams})
    return Snapshot(
        topology=topology,
        running=tuple(running),
        pending=tuple(pending),
        quotas=tuple(quotas),
        config=config or Config(),
    )
