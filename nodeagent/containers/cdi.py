"""The NVIDIA container toolkit's CDI spec: what a container needs for each GPU (device nodes, driver
libraries mounted from the host, hooks such as nvidia-ctk's ldcache update, variables).

`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml` writes one on a real GPU node; the agent reads
it (YAML or JSON) and applies its top-level ``containerEdits`` and those of the devices named like the
task's GPU indexes ("0", "1"…), as podman or containerd would for ``nvidia.com/gpu=0``. Without a spec
the agent gives the device nodes it finds (/dev/nvidiaN, nvidiactl, nvidia-uvm…) and nothing else:
the image must then bring its own user-space driver libraries matching the node's kernel module.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SPEC_PATHS = (
    Path("/etc/cdi/nvidia.yaml"),
    Path("/etc/cdi/nvidia.json"),
    Path("/var/run/cdi/nvidia.yaml"),
    Path("/var/run/cdi/nvidia.json"),
)


class CdiError(Exception):
    """The spec exists but cannot be used; the message says which file and why."""


@dataclass
class Edits:
    """The containerEdits of a spec that apply to one container, merged."""

    env: list[str] = field(default_factory=list)
    device_nodes: list[dict[str, Any]] = field(default_factory=list)
    mounts: list[dict[str, Any]] = field(default_factory=list)
    hooks: list[dict[str, Any]] = field(default_factory=list)

    def add(self, edits: Any) -> None:
        if not isinstance(edits, dict):
            return
        self.env += [str(e) for e in edits.get("env") or []]
        self.device_nodes += [d for d in edits.get("deviceNodes") or [] if isinstance(d, dict) and d.get("path")]
        self.mounts += [m for m in edits.get("mounts") or [] if isinstance(m, dict) and m.get("containerPath")]
        self.hooks += [h for h in edits.get("hooks") or [] if isinstance(h, dict) and h.get("path") and h.get("hookName")]


def find_spec(paths: tuple[Path, ...] = SPEC_PATHS) -> Path | None:
    return next((p for p in paths if p.is_file()), None)


def load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
        if path.suffix == ".json":
            spec = json.loads(text)
        else:
            import yaml  # PyYAML: only a node with a YAML spec needs it

            spec = yaml.safe_load(text)
    except ImportError as exc:
        raise CdiError(f"{path} is YAML and PyYAML is not installed: install it or write the spec as JSON") from exc
    except (OSError, ValueError) as exc:
        raise CdiError(f"cannot read the CDI spec {path}: {exc}") from exc
    except Exception as exc:  # yaml.YAMLError and its kinds
        raise CdiError(f"cannot parse the CDI spec {path}: {exc}") from exc
    if not isinstance(spec, dict):
        raise CdiError(f"the CDI spec {path} is not a mapping")
    return spec


def edits_for(spec: dict[str, Any], gpus: list[int]) -> Edits:
    """The spec's common edits and those of the devices named like `gpus`' indexes."""
    edits = Edits()
    edits.add(spec.get("containerEdits"))
    wanted = {str(i) for i in gpus}
    for device in spec.get("devices") or []:
        if isinstance(device, dict) and str(device.get("name")) in wanted:
            edits.add(device.get("containerEdits"))
    return edits


def device_entry(path: str, host_path: str | None = None) -> dict[str, Any] | None:
    """An OCI linux.devices entry for a host character device, or None if the host has none there."""
    try:
        info = os.stat(host_path or path)
    except OSError:
        return None
    if not stat.S_ISCHR(info.st_mode):
        return None
    return {
        "path": path,
        "type": "c",
        "major": os.major(info.st_rdev),
        "minor": os.minor(info.st_rdev),
        "fileMode": stat.S_IMODE(info.st_mode),
        "uid": 0,
        "gid": 0,
    }


def nvidia_nodes(gpus: list[int], dev: Path = Path("/dev")) -> list[str]:
    """The device nodes of the task's GPUs and the driver's control nodes, those that exist."""
    names = [f"nvidia{i}" for i in gpus]
    if gpus:
        names += ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    return [str(dev / n) for n in names if (dev / n).exists()]
