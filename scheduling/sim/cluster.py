"""The simulated cluster: its shape as parameters and the team quota tree.

Node names are zero-padded ("n0007") so that name order is leaf order; the
first-fit baselines rely on that, as a rack-ordered kube node list would.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from scheduling.core.types import Gpu, Locality, Node, Topology

ROOT = "cluster"


@dataclass(frozen=True, slots=True)
class ClusterShape:
    nodes: int
    gpus_per_node: int = 8
    nodes_per_leaf: int = 32
    leaves_per_spine: int = 4
    # (type, node count) in node order; the node counts must add up to ``nodes``.
    # Default: one type for the whole cluster.
    gpu_types: tuple[tuple[str, int], ...] = ()

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def types(self) -> tuple[tuple[str, int], ...]:
        if not self.gpu_types:
            return (("P40", self.nodes),)
        if sum(n for _, n in self.gpu_types) != self.nodes:
            raise ValueError("GPU type node counts must add up to the number of nodes")
        return self.gpu_types

    @property
    def default_gpu_type(self) -> str:
        return self.types()[0][0]

    def gpus_of_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for name, count in self.types():
            out[name] = out.get(name, 0) + count * self.gpus_per_node
        return out


def build_topology(shape: ClusterShape) -> Topology:
    """One NVLink domain per node (HGX-style), two PCIe switches and NUMA nodes per node."""
    node_types = [name for name, count in shape.types() for _ in range(count)]
    width = max(4, len(str(shape.nodes - 1)))
    half = max(1, shape.gpus_per_node // 2)
    nodes = []
    for i, gpu_type in enumerate(node_types):
        name = f"n{i:0{width}d}"
        leaf_no = i // shape.nodes_per_leaf
        gpus = tuple(
            Gpu(
                id=f"{name}/{g}",
                index=g,
                nvlink=f"{name}/nvl",
                pcie=f"{name}/pcie{g // half}",
                numa=f"{name}/numa{g // half}",
            )
            for g in range(shape.gpus_per_node)
        )
        nodes.append(
            Node(
                name=name,
                leaf=f"leaf-{leaf_no}",
                spine=f"spine-{leaf_no // shape.leaves_per_spine}",
                gpu_type=gpu_type,
                gpus=gpus,
            )
        )
    return Topology(nodes=tuple(nodes))


def read_team_weights(path: Path | str) -> dict[str, float]:
    """``team,<size>`` rows (HeliosArtifact's ``vc,node num``): each team's relative size."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        next(reader)  # header
        return {row[0]: float(row[1]) for row in reader if row}


def scale_guarantees(weights: dict[str, float], teams: Iterable[str], total_gpus: int) -> dict[str, int]:
    """Guarantees proportional to ``weights`` that add up to exactly ``total_gpus``.

    Largest-remainder rounding, ties by team name. A team of the trace with no
    entry gets a guarantee of 0: it runs on borrowed capacity only.
    """
    known = sorted(t for t in weights if weights[t] > 0)
    out = dict.fromkeys(teams, 0)
    if not known:
        return out
    whole = sum(weights[t] for t in known)
    exact = {t: weights[t] / whole * total_gpus for t in known}
    floor = {t: int(v) for t, v in exact.items()}
    left = total_gpus - sum(floor.values())
    for t in sorted(known, key=lambda t: (floor[t] - exact[t], t))[:left]:
        floor[t] += 1
    out.update(floor)
    return out


def span(nodes: Iterable[str], leaf_of: Mapping[str, str], spine_of: Mapping[str, str]) -> tuple[Locality, int, int]:
    """How a gang on ``nodes`` is spread: (locality at node level or above, leaves spanned, spines spanned)."""
    distinct = set(nodes)
    leaves = len({leaf_of[n] for n in distinct})
    spines = len({spine_of[n] for n in distinct})
    if len(distinct) == 1:
        return Locality.NODE, leaves, spines
    if leaves == 1:
        return Locality.LEAF, leaves, spines
    return (Locality.SPINE if spines == 1 else Locality.CLUSTER), leaves, spines
