"""Simulated GPUs for machines without any (`--simulate 8xH100` or `--topology FILE`).

Utilisation follows what the workload says it does: the agent gives each workload a
YARD_SIM_UTIL_FILE and the workload writes a number 0..100 into it (no file means 0 %). A simulated
MIG instance is a GPU like any other here: its workload's file sets its utilisation.

A topology file (JSON, or TOML if it ends in .toml) lists the GPUs; every key but `index` may be left
out, and `mig` lists the MIG instances a GPU is split into (it is then not a whole GPU any more)::

    {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_mb": 81559, "nvlink_domain": "nvl0",
               "pcie_switch": "pcie0", "numa_node": 0, "mig": ["3g.40gb", "3g.40gb"]}, …]}

`--sim-mig "0:1g.10gb*7,1:3g.40gb*2"` gives the same for a --simulate spec or a file: GPU index,
profile and how many (default 1); a GPU may be named twice to mix profiles ("0:4g.40gb,0:3g.40gb").
Layouts are checked against NVIDIA's profile tables (topology.MIG_PROFILES): known profiles, at
most so many of each, at most 7 compute and 8 memory slices per GPU.
"""

from __future__ import annotations

import json
import re
import tomllib
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodeagent.config import SIM_CPUS_PER_GPU, SIM_MEMORY_MB_PER_GPU
from nodeagent.topology import (
    MIG_COMPUTE_SLICES,
    MIG_MAX_PHYSICAL,
    MIG_MEMORY_SLICES,
    MIG_PROFILES,
    MIG_SLOTS,
    GpuInfo,
    GpuSample,
    gpu_type_from_name,
    mig_instance,
)

# name as NVML reports it, memory in MiB as NVML reports it
KNOWN_GPUS: dict[str, tuple[str, int]] = {
    "H100": ("NVIDIA H100 80GB HBM3", 81559),
    "H200": ("NVIDIA H200", 143771),
    "A100": ("NVIDIA A100-SXM4-80GB", 81920),
    "B200": ("NVIDIA B200", 183359),
}
_SPEC = re.compile(r"^(\d+)x([A-Za-z0-9][A-Za-z0-9_-]*)$")
_MIG_PART = re.compile(r"^(\d+):(\d+g\.\d+gb)(?:\*(\d+))?$")


class TopologyError(Exception):
    """A --simulate spec or --topology file is wrong; the message says how."""


def _sim_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.yardmaster.sim"))


def _sim_mig_uuid(parent_uuid: str, slot: int) -> str:
    # Like a real one ("MIG-" and a UUID), stable for the same parent and slot.
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{parent_uuid}.mig{slot}.yardmaster.sim"))


def parse_mig_layout(spec: str) -> dict[int, list[str]]:
    """`"0:1g.10gb*7,1:3g.40gb*2"` -> {0: ["1g.10gb"] * 7, 1: ["3g.40gb"] * 2} (checked per GPU type
    by with_mig, which knows the GPUs)."""
    layout: dict[int, list[str]] = {}
    for part in (p.strip() for p in spec.split(",")):
        match = _MIG_PART.match(part)
        if not match:
            raise TopologyError(f"bad --sim-mig part {part!r}: expected GPU:PROFILE[*COUNT] such as 0:1g.10gb*7")
        count = int(match.group(3) or 1)
        if not 1 <= count <= MIG_SLOTS:
            raise TopologyError(f"bad --sim-mig part {part!r}: a GPU holds 1 to 7 instances")
        layout.setdefault(int(match.group(1)), []).extend([match.group(2)] * count)
    return layout


def check_mig(gpu: GpuInfo, profiles: list[str], *, where: str) -> None:
    """Raise TopologyError unless `profiles` is a MIG layout this GPU's type can hold."""
    table = MIG_PROFILES.get(gpu.gpu_type)
    if table is None:
        known = ", ".join(sorted(MIG_PROFILES))
        raise TopologyError(f"{where}: GPU {gpu.index} is a {gpu.gpu_type}; simulated MIG knows {known}")
    if not profiles:
        raise TopologyError(f"{where}: GPU {gpu.index} has an empty MIG layout")
    if gpu.index >= MIG_MAX_PHYSICAL:
        raise TopologyError(f"{where}: GPU {gpu.index}: only GPUs 0..{MIG_MAX_PHYSICAL - 1} can be split into MIG instances")
    for profile in sorted(set(profiles)):
        if profile not in table:
            raise TopologyError(f"{where}: GPU {gpu.index}: {gpu.gpu_type} has no MIG profile {profile!r} ({', '.join(table)})")
        most, count = table[profile][2], profiles.count(profile)
        if count > most:
            raise TopologyError(f"{where}: GPU {gpu.index}: a {gpu.gpu_type} holds at most {most} × {profile}, not {count}")
    compute = sum(table[p][0] for p in profiles)
    memory = sum(table[p][1] for p in profiles)
    if compute > MIG_COMPUTE_SLICES or memory > MIG_MEMORY_SLICES:
        raise TopologyError(
            f"{where}: GPU {gpu.index}: {' + '.join(profiles)} needs {compute} compute and {memory} memory slices; "
            f"a {gpu.gpu_type} has {MIG_COMPUTE_SLICES} and {MIG_MEMORY_SLICES}"
        )


def _split(gpu: GpuInfo, profiles: list[str]) -> list[GpuInfo]:
    table = MIG_PROFILES[gpu.gpu_type]
    return [
        mig_instance(
            gpu,
            physical=gpu.index,
            slot=slot,
            uuid=_sim_mig_uuid(gpu.uuid, slot),
            profile=profile,
            memory_mb=gpu.memory_mb * table[profile][1] // MIG_MEMORY_SLICES,
        )
        for slot, profile in enumerate(profiles)
    ]


def with_mig(gpus: list[GpuInfo], layout: Mapping[int, list[str]], *, where: str = "--sim-mig") -> list[GpuInfo]:
    """The GPUs with those named in `layout` split into MIG instances (which replace them)."""
    by_index = {gpu.index: gpu for gpu in gpus}
    missing = sorted(set(layout) - set(by_index))
    if missing:
        raise TopologyError(f"{where}: this node has no GPU {', '.join(map(str, missing))}")
    out: list[GpuInfo] = []
    for gpu in gpus:
        profiles = layout.get(gpu.index)
        if profiles is None:
            out.append(gpu)
            continue
        check_mig(gpu, profiles, where=where)
        out.extend(_split(gpu, profiles))
    return sorted(out, key=lambda g: g.index)


def gpus_from_spec(spec: str, *, node: str) -> list[GpuInfo]:
    """`8xH100` -> an HGX-like node: one NVLink domain (NVSwitch), the GPUs split in halves over two
    PCIe switches and two NUMA nodes."""
    match = _SPEC.match(spec.strip())
    if not match or int(match.group(1)) < 1:
        raise TopologyError(f"bad --simulate spec {spec!r}: expected COUNTxTYPE such as 8xH100")
    count, gpu_type = int(match.group(1)), match.group(2).upper()
    name, memory_mb = KNOWN_GPUS.get(gpu_type, (f"NVIDIA {gpu_type}", 81920))
    halves = 2 if count >= 2 else 1
    return [
        GpuInfo(
            index=i,
            uuid=_sim_uuid(node, i),
            name=name,
            gpu_type=gpu_type,
            memory_mb=memory_mb,
            nvlink_domain="nvl0",
            pcie_switch=f"pcie{i * halves // count}",
            numa_node=i * halves // count,
        )
        for i in range(count)
    ]


def gpus_from_file(path: Path, *, node: str) -> list[GpuInfo]:
    """A topology file (JSON, or TOML if it ends in .toml), as the module's docstring shows."""
    layout: dict[int, list[str]] = {}
    try:
        text = path.read_text()
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        entries = data["gpus"]
        gpus = []
        for position, entry in enumerate(entries):
            index = int(entry.get("index", position))
            name = str(entry.get("name", "NVIDIA H100 80GB HBM3"))
            numa = entry.get("numa_node")
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=str(entry.get("uuid", _sim_uuid(node, index))),
                    name=name,
                    gpu_type=str(entry.get("gpu_type", gpu_type_from_name(name))),
                    memory_mb=int(entry.get("memory_mb", 81559)),
                    nvlink_domain=str(entry.get("nvlink_domain", f"nvl{index}")),
                    pcie_switch=str(entry.get("pcie_switch", f"pcie{index}")),
                    numa_node=None if numa is None else int(numa),
                )
            )
            if entry.get("mig") is not None:
                mig = entry["mig"]
                if not isinstance(mig, list) or not all(isinstance(p, str) for p in mig):
                    raise TypeError(f'GPU {index}: mig must be a list of profile names such as "1g.10gb"')
                layout[index] = list(mig)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, tomllib.TOMLDecodeError) as exc:
        raise TopologyError(f"cannot read topology file {path}: {exc!r}") from exc
    if not gpus or len({g.index for g in gpus}) != len(gpus):
        raise TopologyError(f"topology file {path} must list GPUs with distinct indices")
    return with_mig(sorted(gpus, key=lambda g: g.index), layout, where=f"topology file {path}")


def simulated_gpus(
    *,
    node: str,
    simulate: str | None = None,
    topology_file: Path | None = None,
    mig: str | None = None,
    cpus: int | None = None,
    memory_mb: int | None = None,
) -> SimulatedGpus:
    """The simulated GPU source an agent's options describe (a spec, or else a topology file)."""
    for what, value in (("--sim-cpus", cpus), ("--sim-memory-mb", memory_mb)):
        if value is not None and (type(value) is not int or value <= 0):
            raise TopologyError(f"{what} must be a positive integer, not {value!r}")
    if simulate is not None:
        gpus = gpus_from_spec(simulate, node=node)
    elif topology_file is not None:
        gpus = gpus_from_file(topology_file, node=node)
    else:
        raise TopologyError("simulated GPUs need --simulate COUNTxTYPE or --topology FILE")
    if mig:
        if any(g.mig_profile for g in gpus):
            raise TopologyError("--sim-mig: the topology file gives a MIG layout already")
        gpus = with_mig(gpus, parse_mig_layout(mig))
    return SimulatedGpus(gpus, cpus=cpus, memory_mb=memory_mb)


def read_util(path: Path | None) -> float:
    """What the workload says its utilisation is; anything unreadable counts as idle."""
    if path is None:
        return 0.0
    try:
        return min(100.0, max(0.0, float(path.read_text().strip() or 0)))
    except (OSError, ValueError):
        return 0.0


class SimulatedGpus:
    simulated = True

    def __init__(self, gpus: list[GpuInfo], *, cpus: int | None = None, memory_mb: int | None = None) -> None:
        self._gpus = gpus
        # Scaled by the physical GPUs (a MIG instance is a slice of one), as a real server is.
        physical = len({gpu.parent_uuid or gpu.uuid for gpu in gpus})
        self.cpus = cpus if cpus is not None else SIM_CPUS_PER_GPU * physical
        self.memory_mb = memory_mb if memory_mb is not None else SIM_MEMORY_MB_PER_GPU * physical

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self, util_files: Mapping[int, Path]) -> list[GpuSample]:
        samples = []
        for gpu in self._gpus:
            util = read_util(util_files.get(gpu.index))
            # Rough H100-like curves, so dashboards show plausible numbers.
            samples.append(
                GpuSample(
                    uuid=gpu.uuid,
                    index=gpu.index,
                    utilization_pct=util,
                    memory_used_mb=int(gpu.memory_mb * 0.9 * util / 100),
                    temperature_c=round(30 + 0.45 * util, 1),
                    power_w=round(70 + 6.3 * util, 1),
                )
            )
        return samples

    def close(self) -> None:
        return None
