"""The cluster map: spines → leaves → nodes → GPUs, coloured by state and team, in a fixed number of queries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from portal.views.common import partial, team_colour
from scheduling.models import Allocation, Gpu, Node, NodeState


@dataclass
class GpuCell:
    index: int
    state: str  # "free", "busy", "unhealthy", "offline"
    utilization: float | None
    memory_used_mb: float | None
    team: str = ""
    colour: str = ""
    job_id: int | None = None


@dataclass
class NodeBox:
    node: Node
    gpus: list[GpuCell] = field(default_factory=list)

    @property
    def free(self) -> int:
        return sum(1 for g in self.gpus if g.state == "free")

    @property
    def schedulable(self) -> bool:
        return self.node.state == NodeState.READY


@dataclass
class LeafBox:
    name: str
    nodes: list[NodeBox] = field(default_factory=list)

    @property
    def free(self) -> int:
        return sum(n.free for n in self.nodes)

    @property
    def whole_nodes_free(self) -> int:
        """Nodes with every GPU free: what a multi-node gang can use under this leaf."""
        return sum(1 for n in self.nodes if n.gpus and n.free == len(n.gpus))


@dataclass
class SpineBox:
    name: str
    leaves: list[LeafBox] = field(default_factory=list)


def _gpu_state(gpu: Any, node: Node, alloc: Any) -> str:
    if alloc is not None:
        return "busy"
    if not gpu["healthy"]:
        return "unhealthy"
    return "free" if node.state == NodeState.READY else "offline"


def cluster_layout() -> tuple[list[SpineBox], dict[str, Any]]:
    """Three queries whatever the size of the cluster: nodes, GPUs, live allocations."""
    nodes = list(Node.objects.select_related("leaf__spine").order_by("leaf__spine__name", "leaf__name", "name"))
    gpus_by_node: dict[int, list[Any]] = defaultdict(list)
    for gpu in Gpu.objects.order_by("node_id", "index").values(
        "id", "node_id", "index", "healthy", "utilization_pct", "memory_used_mb"
    ):
        gpus_by_node[gpu["node_id"]].append(gpu)
    live: dict[int, Any] = {
        a["gpu_id"]: a
        for a in Allocation.objects.filter(released_at__isnull=True).values("gpu_id", "job_id", "job__team_id", "job__team__name")
    }
    spines: dict[str, SpineBox] = {}
    leaves: dict[str, LeafBox] = {}
    teams: dict[str, str] = {}
    totals = {"gpus": 0, "free": 0, "busy": 0, "fragmented_free": 0}
    for node in nodes:
        spine = spines.setdefault(node.leaf.spine.name, SpineBox(node.leaf.spine.name))
        if node.leaf.name not in leaves:
            leaves[node.leaf.name] = LeafBox(node.leaf.name)
            spine.leaves.append(leaves[node.leaf.name])
        box = NodeBox(node)
        for gpu in gpus_by_node[node.pk]:
            alloc = live.get(gpu["id"])
            cell = GpuCell(gpu["index"], _gpu_state(gpu, node, alloc), gpu["utilization_pct"], gpu["memory_used_mb"])
            if alloc is not None:
                cell.team, cell.job_id = alloc["job__team__name"], alloc["job_id"]
                cell.colour = team_colour(alloc["job__team_id"])
                teams[cell.team] = cell.colour
            box.gpus.append(cell)
        leaves[node.leaf.name].nodes.append(box)
        totals["gpus"] += len(box.gpus)
        totals["free"] += box.free
        totals["busy"] += sum(1 for g in box.gpus if g.state == "busy")
        # Free GPUs on a partly used node serve only small jobs: that is the fragmentation to watch.
        if 0 < box.free < len(box.gpus):
            totals["fragmented_free"] += box.free
    summary = {**totals, "teams": sorted(teams.items()), "nodes": len(nodes)}
    summary["not_ready"] = [n for n in nodes if n.state != NodeState.READY]
    return list(spines.values()), summary


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    spines, summary = cluster_layout()
    return render(request, partial(request, "portal/cluster.html", "map"), {"spines": spines, "summary": summary})
