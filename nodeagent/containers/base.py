"""The container runtime's interface, and what it runs: a plan per task's container.

A runtime prepares a bundle for a task (``prepare``), gives the argv that runs it in the foreground
under the agent's wrapper (``run_argv``: the wrapper's exit status is the container's), signals every
process of a container (``signal``: a pid namespace and runc's own session keep them out of the
wrapper's process group, so signalling the group alone would not reach them), removes what is left of
one (``delete``) and says whether one exists (``state``, ``list``). runc is the one there is
(runc.py); enroot, Apptainer or podman would be another class with the same calls, and a case in
runtime.py's ``detect`` and ``from_ref``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AUTO, RUNC, NONE = "auto", "runc", "none"
CHOICES = (AUTO, RUNC, NONE)


def container_id(launch_id: str) -> str:
    """The container's name, from the task's launch id: a restarted agent finds it by its journal."""
    return f"yard-{launch_id}"


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    readonly: bool = False


@dataclass(frozen=True)
class ImageConfig:
    """What the image itself says: its Env ("K=V"), Entrypoint+Cmd, and working directory."""

    env: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)
    workdir: str = "/"


@dataclass
class ContainerPlan:
    """Everything a runtime needs to run one task's container."""

    container_id: str
    bundle: Path  # per task: config.json and the rootfs mount point
    rootfs: Path  # the image's unpacked rootfs, shared by every task of that image (read-only)
    image: ImageConfig
    args: list[str]
    env: dict[str, str]
    cwd: str
    uid: int = 0
    gid: int = 0
    groups: list[int] = field(default_factory=list)
    mounts: list[Mount] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    hostname: str = "yard"
    # Where the container's cgroup goes (relative to the cgroup mount), None: the runtime's default.
    cgroups_path: str | None = None
    # The cores the task is pinned to (cgroup v1: joining a cpuset cgroup would otherwise widen them).
    cpus: list[int] | None = None


class Runtime(ABC):
    name: str

    @abstractmethod
    def prepare(self, plan: ContainerPlan) -> str:
        """Write the bundle; returns a note on how its root is writable (for the task's log line)."""

    @abstractmethod
    def run_argv(self, plan: ContainerPlan) -> list[str]:
        """The foreground command that runs the prepared container and exits with its status."""

    @abstractmethod
    def signal(self, container_id: str, signum: int) -> bool:
        """Signal every process of the container; False if there is no such container (any more)."""

    @abstractmethod
    def delete(self, container_id: str, bundle: Path | None) -> None:
        """Kill whatever is left of the container and remove it, and its bundle's mounts."""

    @abstractmethod
    def state(self, container_id: str) -> str | None:
        """ "running", "created", "stopped"… or None when no such container exists."""

    @abstractmethod
    def list(self) -> list[str]:
        """The ids of the containers this runtime (with this agent's state) knows."""

    @abstractmethod
    def ref(self, container_id: str) -> dict[str, Any]:
        """What the journal keeps to find the container again (from_ref)."""
