"""The cluster map: spines → leaves → (NVLink fabric domains) → nodes → GPUs, coloured by state and team, in a
fixed number of queries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, cast

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from portal.views.common import add_service_errors, partial, signed_in, team_colour
from scheduling.agent.services import SKEW_SHOWN_S
from scheduling.models import Allocation, Gpu, Node, NodeState
from scheduling.services import DRAIN_REASON_MAX, node_hold, node_resume
from tenants.selectors import is_cluster_admin


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
class NodesBox:
    """A named group of nodes on the map, with its free GPUs and whole free nodes."""

    name: str
    nodes: list[NodeBox] = field(default_factory=list)

    @property
    def free(self) -> int:
        return sum(n.free for n in self.nodes)

    @property
    def whole_nodes_free(self) -> int:
        """Nodes with every GPU free: what a multi-node gang kept to this group can use."""
        return sum(1 for n in self.nodes if n.gpus and n.free == len(n.gpus))


@dataclass
class FabricBox(NodesBox):
    """The nodes of a leaf in one multi-node NVLink domain (``Node.fabric_domain``); name "": in none."""


@dataclass
class LeafBox(NodesBox):
    """The nodes under one leaf switch, grouped by fabric domain where they have one."""

    @property
    def groups(self) -> list[FabricBox]:
        """The leaf's nodes by fabric domain, in the order the domains first appear (one group of
        nodes in none, name "", where there are such nodes): one group for a leaf without domains."""
        groups: dict[str, FabricBox] = {}
        for box in self.nodes:
            name = box.node.fabric_domain
            groups.setdefault(name, FabricBox(name)).nodes.append(box)
        return list(groups.values())


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
    summary = {**totals, "teams": sorted(teams.items()), "nodes": len(nodes), "all_nodes": nodes}
    summary["with_runtime"] = sum(1 for n in nodes if n.container_runtime)
    for n in nodes:
        n.clock_words = clock_words(n.clock_skew_s)  # type: ignore[attr-defined]
    summary["not_ready"] = [
        n
        for n in nodes
        if n.state != NodeState.READY or n.hold_reason or n.disk_problem or n.clock_words  # type: ignore[attr-defined]
    ]
    return list(spines.values()), summary


def clock_words(skew_s: float | None) -> str:
    """A node's clock against the portal's, in words, when it is off by SKEW_SHOWN_S or more ("" otherwise).
    The portal corrects the times the agent sends by it; the node's NTP should be looked at."""
    if skew_s is None or abs(skew_s) < SKEW_SHOWN_S:
        return ""
    amount = abs(skew_s)
    said = f"{amount:.0f} s" if amount < 120 else f"{amount / 60:.0f} min" if amount < 7200 else f"{amount / 3600:.1f} h"
    return f"its clock is {said} {'ahead of' if skew_s > 0 else 'behind'} the portal's"


class NodeMaintenanceForm(forms.Form):
    """Drain a node (no new work; running work finishes) or resume it: cluster admins only. The rules
    (a drain needs a reason, only a drained node resumes) are the services'; their messages land here."""

    node = forms.ChoiceField(label="Node")
    reason = forms.CharField(
        label="Reason (needed to drain)",
        required=False,
        max_length=DRAIN_REASON_MAX,
        widget=forms.TextInput(attrs={"placeholder": "e.g. replace GPU 3, firmware update"}),
    )
    action = forms.ChoiceField(choices=[("drain", "Drain"), ("resume", "Resume")])

    def __init__(self, *args: Any, nodes: list[Node], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.nodes = {node.name: node for node in nodes}
        cast(forms.ChoiceField, self.fields["node"]).choices = [(n.name, f"{n.name} ({n.get_state_display()})") for n in nodes]


def _page(request: HttpRequest, *, form: NodeMaintenanceForm | None = None, status: int = 200) -> HttpResponse:
    spines, summary = cluster_layout()
    context: dict[str, Any] = {"spines": spines, "summary": summary}
    if is_cluster_admin(request.user) and not getattr(request, "htmx", False):
        context["maintenance_form"] = form or NodeMaintenanceForm(nodes=summary["all_nodes"])
    return render(request, partial(request, "portal/cluster.html", "map"), context, status=status)


@login_required
def cluster(request: HttpRequest) -> HttpResponse:
    return _page(request)


@login_required
@require_POST
def node_maintenance(request: HttpRequest) -> HttpResponse:
    if not is_cluster_admin(request.user):
        raise PermissionDenied("Only cluster admins drain and resume nodes.")
    form = NodeMaintenanceForm(request.POST, nodes=list(Node.objects.order_by("name")))
    if form.is_valid():
        node, actor = form.nodes[form.cleaned_data["node"]], signed_in(request)
        try:
            if form.cleaned_data["action"] == "drain":
                node = node_hold(node=node, reason=form.cleaned_data["reason"], actor=actor)
                messages.success(request, f"{node.name} drained: no new work lands on it; running work finishes.")
            else:
                node = node_resume(node=node, actor=actor)
                messages.success(request, f"{node.name} resumed ({node.get_state_display()}).")
            return HttpResponseRedirect(reverse("cluster"))
        except ValidationError as error:
            add_service_errors(form, error)
    return _page(request, form=form, status=400)
