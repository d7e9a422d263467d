"""The cluster's topology as the core sees it: every node (only READY ones schedulable) with its healthy
GPUs, one core node per node's MIG instances of one type; cached while unchanged, with its capacity.

Apart from ``snapshot`` because every submission's admission check reads it (``cluster_capacity``)
without the rest of a snapshot.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import replace
from typing import Any, cast

from django.db import connection

from scheduling.core.capacity import Capacity, capacity_of
from scheduling.core.types import NO_CAPABILITIES, WITH_CONTAINERS, Topology
from scheduling.core.types import Gpu as CoreGpu
from scheduling.core.types import Node as CoreNode
from scheduling.models import Gpu, Node, NodeState
from scheduling.selectors.config import yard_number


def _topology() -> Topology:
    """Every node (only READY ones schedulable) with its healthy GPUs. Plain tuples, no model instances:
    this runs at every cycle and every submit's admission check, over every GPU of the cluster."""
    node_rows = list(
        Node.objects.order_by("name").values_list(
            "id",
            "name",
            "leaf__name",
            "leaf__spine__name",
            "gpu_type",
            "state",
            "cpus",
            "memory_mb",
            "fabric_domain",
            "container_runtime",
        )
    )
    node_types = {row[0]: row[4] for row in node_rows}
    gpus_by_node: dict[int, list[CoreGpu]] = defaultdict(list)
    # MIG instances (a type of their own, "H100.1g.10gb") by node and type: each such set is a core node
    # of its own (``core_node_name``), so a job of one type is only ever placed on GPUs of that type.
    slices: dict[int, dict[str, list[CoreGpu]]] = defaultdict(lambda: defaultdict(list))
    rows = Gpu.objects.filter(healthy=True).order_by("node_id", "index")
    for pk, node_id, index, nvlink, pcie, numa, gpu_type in rows.values_list(
        "id", "node_id", "index", "nvlink_domain", "pcie_switch", "numa_node", "gpu_type"
    ):
        gpu = CoreGpu(id=str(pk), index=index, nvlink=nvlink, pcie=pcie, numa=numa)
        if gpu_type and gpu_type != node_types.get(node_id):
            slices[node_id][gpu_type].append(gpu)
        else:
            gpus_by_node[node_id].append(gpu)
    # What jobs may be given of each node's cores and memory: what its agent reported less the system
    # reserve (0, "not known", stays 0: such a node is not held to it; a reserve larger leaves 1).
    reserve_cpus, reserve_mb = int(yard_number("SYSTEM_RESERVE_CPUS")), int(yard_number("SYSTEM_RESERVE_MEMORY_MB"))
    by_pk = {
        pk: CoreNode(
            name=name,
            leaf=leaf,
            spine=spine,
            gpu_type=gpu_type,
            gpus=tuple(gpus_by_node.get(pk, ())),
            schedulable=state == NodeState.READY,
            cpus=max(cpus - reserve_cpus, 1) if cpus else 0,
            memory_mb=max(memory_mb - reserve_mb, 1) if memory_mb else 0,
            fabric=fabric,
            # A node whose agent found a container runtime takes jobs that name an image (docs/containers.md).
            capabilities=WITH_CONTAINERS if runtime else NO_CAPABILITIES,
        )
        for pk, name, leaf, spine, gpu_type, state, cpus, memory_mb, fabric, runtime in node_rows
    }
    # A node's slices share its cores and memory with its whole GPUs; they are not held to them
    # (docs/scheduler-core.md, "MIG"): the whole GPUs' node is, and the agent limits each task.
    nodes = tuple(by_pk.values()) + tuple(
        replace(
            by_pk[node_id],
            name=core_node_name(by_pk[node_id].name, gpu_type),
            gpu_type=gpu_type,
            gpus=tuple(gpus),
            cpus=0,
            memory_mb=0,
        )
        for node_id, by_type in sorted(slices.items())
        for gpu_type, gpus in sorted(by_type.items())
    )
    return Topology(nodes=nodes)


MIG_NODE_MARK = "~"  # "h100-03~H100.1g.10gb": the core's node for one node's MIG instances of one type


def core_node_name(node_name: str, gpu_type: str) -> str:
    return f"{node_name}{MIG_NODE_MARK}{gpu_type}"


def node_name_of(core_name: str) -> str:
    """The node a core node name stands for (its MIG instances' core node names the node too)."""
    return core_name.split(MIG_NODE_MARK, 1)[0]


_TOPOLOGY: dict[str, Any] = {"key": None, "value": None, "capacity": None, "at": 0.0}
_TOPOLOGY_MAX_AGE_S = 30.0


def _topology_key() -> tuple[object, ...]:
    """What changes when the topology does: the node set, any node's state, the set of unhealthy GPUs,
    the nodes that have a container runtime.

    One statement of index-only aggregates (every submission's admission check asks it), where reading
    the topology reads every GPU."""
    node, gpu = Node._meta.db_table, Gpu._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT COUNT(id), MAX(id), MAX(state_changed_at), "
            f"SUM(CASE WHEN state = %s THEN 1 ELSE 0 END), SUM(CASE WHEN state = %s THEN id ELSE 0 END), "
            f"(SELECT COUNT(id) FROM {gpu} WHERE NOT healthy), (SELECT SUM(id) FROM {gpu} WHERE NOT healthy), "
            f"SUM(CASE WHEN container_runtime <> '' THEN id ELSE 0 END) "
            f"FROM {node}",
            [NodeState.READY, NodeState.READY],
        )
        return tuple(cursor.fetchone())


def topology_cached() -> Topology:
    """The topology (every node, only READY ones schedulable, healthy GPUs), reused while unchanged.

    The same object for consecutive cycles also lets the core reuse its index of it (TopoIndex is cached
    on the object's identity). Rebuilt when the key changes and at least every half minute.
    """
    key = _topology_key()
    now = time.monotonic()
    if _TOPOLOGY["key"] != key or now - _TOPOLOGY["at"] > _TOPOLOGY_MAX_AGE_S:
        topology = _topology()
        _TOPOLOGY.update(key=key, value=topology, capacity=capacity_of(topology), at=now)
    return cast(Topology, _TOPOLOGY["value"])


def cluster_capacity() -> Capacity:
    """The cluster's shape for the admission check (scheduling/core/capacity.py), cached with the topology."""
    topology_cached()
    return cast(Capacity, _TOPOLOGY["capacity"])
