"""GPU descriptions, telemetry samples, and folding NVML's pairwise topology into domains.

Pure functions and plain data: the NVML and the simulated GPU sources both produce these.
"""

from __future__ import annotations

import re
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
    # A MIG instance: its profile ("1g.10gb") and the UUID of the physical GPU it is a slice of;
    # both empty for a whole GPU. Its gpu_type is then "<parent type>.<profile>" ("H100.1g.10gb").
    mig_profile: str = ""
    parent_uuid: str = ""

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
    # The node's CPU cores and memory (MiB), registered with its GPUs; 0 means unknown.
    cpus: int
    memory_mb: int

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


# -- MIG -------------------------------------------------------------------------------------------
# A MIG instance is reported as a GPU of its own, under an index no whole GPU has: instance slot s
# (NVML's MIG device index, 0..7) of physical GPU p (0..15) is 128 + 8p + s. It is stable while the
# GPU's MIG layout stays the same, and fits the agent API's GPU index (0..255); whole GPUs keep their
# NVML index. CUDA_VISIBLE_DEVICES names MIG instances by UUID, never by this number.
MIG_INDEX_BASE = 128
MIG_SLOTS = 8
MIG_MAX_PHYSICAL = (256 - MIG_INDEX_BASE) // MIG_SLOTS  # 16

# The GPU instance profiles NVIDIA documents per GPU type: profile -> (compute slices, memory eighths,
# most instances of it on one GPU). A GPU has 7 compute slices and 8 memory slices in all.
MIG_PROFILES: dict[str, dict[str, tuple[int, int, int]]] = {
    "H100": {
        "1g.10gb": (1, 1, 7),
        "1g.20gb": (1, 2, 4),
        "2g.20gb": (2, 2, 3),
        "3g.40gb": (3, 4, 2),
        "4g.40gb": (4, 4, 1),
        "7g.80gb": (7, 8, 1),
    },
    "A100": {
        "1g.10gb": (1, 1, 7),
        "2g.20gb": (2, 2, 3),
        "3g.40gb": (3, 4, 2),
        "4g.40gb": (4, 4, 1),
        "7g.80gb": (7, 8, 1),
    },
}
MIG_COMPUTE_SLICES = 7
MIG_MEMORY_SLICES = 8
# "NVIDIA H100 80GB HBM3 MIG 1g.10gb", or with a compute instance smaller than its GPU instance
# "… MIG 1c.3g.40gb"; a "+me" (media extensions) suffix does not change what is scheduled.
_MIG_PROFILE = re.compile(r"(?:(\d+)c\.)?(\d+)g\.(\d+)gb")


def mig_index(physical: int, slot: int) -> int:
    """The node-unique index of instance `slot` of physical GPU `physical` (see MIG_INDEX_BASE)."""
    if not (0 <= physical < MIG_MAX_PHYSICAL and 0 <= slot < MIG_SLOTS):
        raise ValueError(f"MIG instance {slot} of GPU {physical} has no index (GPUs 0..15, instances 0..7)")
    return MIG_INDEX_BASE + MIG_SLOTS * physical + slot


def mig_profile_from_name(name: str) -> str | None:
    """ "1g.10gb" from a MIG device's NVML name ("NVIDIA H100 80GB HBM3 MIG 1g.10gb"); None if it has none."""
    matches = list(_MIG_PROFILE.finditer(name))
    return matches[-1].group(0) if matches else None


def mig_profile_from_attributes(*, slices: int, memory_mb: int) -> str:
    """ "3g.40gb" from a GPU instance's slice count and memory, as NVIDIA names profiles (memory
    rounded to whole GB: 40192 MiB -> 40gb)."""
    return f"{slices}g.{max(1, round(memory_mb / 1000))}gb"


def mig_instance(parent: GpuInfo, *, physical: int, slot: int, uuid: str, profile: str, memory_mb: int) -> GpuInfo:
    """A MIG instance as a GPU entry: the parent's place in the topology, its own index, type and UUID."""
    return GpuInfo(
        index=mig_index(physical, slot),
        uuid=uuid,
        name=f"{parent.name} MIG {profile}",
        gpu_type=f"{parent.gpu_type}.{profile}",
        memory_mb=memory_mb,
        nvlink_domain=parent.nvlink_domain,
        pcie_switch=parent.pcie_switch,
        numa_node=parent.numa_node,
        mig_profile=profile,
        parent_uuid=parent.uuid,
    )


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
