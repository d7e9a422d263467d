"""GPU descriptions, telemetry samples, and folding NVML's pairwise topology into domains.

Pure functions and plain data: the NVML and the simulated GPU sources both produce these.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    gpu_type: str
    memory_mb: int
    nvlink_domain: str
    pcie_switch: str
    numa_node: int | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class GpuSample:
    """One telemetry reading of one GPU; a metric that could not be read is None."""

    uuid: str
    index: int
    utilization_pct: float | None
    memory_used_mb: int | None
    temperature_c: float | None
    power_w: float | None
    xid_errors: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class GpuSource(Protocol):
    """Where GPUs and their telemetry come from: NVML, or simulated GPUs."""

    simulated: bool

    def gpus(self) -> list[GpuInfo]: ...

    def sample(self, util_files: Mapping[int, Path]) -> list[GpuSample]:
        """Read telemetry now. `util_files` maps a GPU index to its workload's YARD_SIM_UTIL_FILE
        (only simulated GPUs use it). XID errors are those seen since the previous call."""
        ...

    def close(self) -> None: ...


_VENDOR_WORDS = {"NVIDIA", "Tesla", "GeForce", "Quadro"}


def gpu_type_from_name(name: str) -> str:
    """The short type quotas are kept in: "NVIDIA H100 80GB HBM3" -> "H100", "NVIDIA A100-SXM4-80GB" -> "A100"."""
    words = [w for w in name.replace("-", " ").split() if w not in _VENDOR_WORDS]
    if not words:
        return name or "unknown"
    if words[0] == "RTX" and len(words) > 1:
        return f"RTX{words[1]}"
    return words[0]


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[Hashable, Hashable] = {}

    def find(self, item: Hashable) -> Hashable:
        self.parent.setdefault(item, item)
        root = item
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[item] != root:
            self.parent[item], item = root, self.parent[item]
        return root

    def union(self, a: Hashable, b: Hashable) -> None:
        self.parent[self.find(a)] = self.find(b)


def fold_groups(indices: Iterable[int], edges: Iterable[tuple[Hashable, Hashable]], prefix: str) -> dict[int, str]:
    """Label the connected components of a graph over GPU indices (plus any other vertices, such as
    an NVSwitch, that connect them). Labels are `prefix0`, `prefix1`… in order of each component's
    lowest GPU index, so the same machine always gets the same labels; a lone GPU is its own group."""
    ordered = sorted(indices)
    forest = _UnionFind()
    for index in ordered:
        forest.find(("gpu", index))
    for a, b in edges:
        forest.union(a, b)
    labels: dict[Hashable, str] = {}
    result: dict[int, str] = {}
    for index in ordered:
        root = forest.find(("gpu", index))
        labels.setdefault(root, f"{prefix}{len(labels)}")
        result[index] = labels[root]
    return result
