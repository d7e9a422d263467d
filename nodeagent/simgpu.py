"""Simulated GPUs for machines without any (`--simulate 8xH100` or `--topology FILE`).

Utilisation follows what the workload says it does: the agent gives each workload a
YARD_SIM_UTIL_FILE and the workload writes a number 0..100 into it (no file means 0 %).
"""

from __future__ import annotations

import json
import re
import tomllib
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodeagent.topology import GpuInfo, GpuSample, gpu_type_from_name

# name as NVML reports it, memory in MiB as NVML reports it
KNOWN_GPUS: dict[str, tuple[str, int]] = {
    "H100": ("NVIDIA H100 80GB HBM3", 81559),
    "H200": ("NVIDIA H200", 143771),
    "A100": ("NVIDIA A100-SXM4-80GB", 81920),
    "B200": ("NVIDIA B200", 183359),
}
_SPEC = re.compile(r"^(\d+)x([A-Za-z0-9][A-Za-z0-9_-]*)$")


class TopologyError(Exception):
    """A --simulate spec or --topology file is wrong; the message says how."""


def _sim_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}.gpu{index}.yardmaster.sim"))


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
    """A topology file (JSON, or TOML if it ends in .toml): `{"gpus": [{"index": 0, "name": …,
    "memory_mb": …, "nvlink_domain": …, "pcie_switch": …, "numa_node": …}, …]}`."""
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
    except (OSError, ValueError, KeyError, TypeError, AttributeError, tomllib.TOMLDecodeError) as exc:
        raise TopologyError(f"cannot read topology file {path}: {exc!r}") from exc
    if not gpus or len({g.index for g in gpus}) != len(gpus):
        raise TopologyError(f"topology file {path} must list GPUs with distinct indices")
    return sorted(gpus, key=lambda g: g.index)


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

    def __init__(self, gpus: list[GpuInfo]) -> None:
        self._gpus = gpus

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
