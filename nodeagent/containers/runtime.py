"""The container runtime behind one small interface, and which one this node has.

A runtime prepares a bundle for a task (``prepare``), gives the argv that runs it in the foreground
under the agent's wrapper (``run_argv``: the wrapper's exit status is the container's), signals every
process of a container (``signal``: a pid namespace and runc's own session keep them out of the
wrapper's process group, so signalling the group alone would not reach them), removes what is left of
one (``delete``) and says whether one exists (``state``, ``list``). runc is the one there is
(runc.py); enroot, Apptainer or podman would be another class here with the same five calls.

The journal keeps ``Runtime.ref(container_id)`` for each container task, a small dict from which
``from_ref`` rebuilds the runtime: the node's watchdog (a separate process) and a restarted agent
stop or adopt a container by it without any other state.
"""

from __future__ import annotations

import os
import shutil
import signal
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


def from_ref(ref: dict[str, Any] | None) -> tuple[Runtime, str] | None:
    """The runtime and container id a journal entry names, or None (no container, unknown runtime)."""
    if not ref or ref.get("runtime") != RUNC:
        return None
    from nodeagent.containers.runc import Runc

    return Runc(binary=str(ref["binary"]), root=Path(str(ref["root"]))), str(ref["id"])


def signal_task(ref: dict[str, Any] | None, pgid: int | None, signum: int) -> None:
    """Signal a task the way its kind needs: a host task's process group; a container's processes
    through its runtime. SIGTERM goes to the container's processes only (its runtime, in the
    wrapper's group, would forward a second one to the container's init); SIGKILL to both, the
    container first, so no process of it outlives its runtime."""
    from nodeagent import launcher

    found = from_ref(ref)
    if found is not None:
        runtime, cid = found
        if runtime.signal(cid, signum) and signum != signal.SIGKILL:
            return
        # No container (yet, or any more): its runtime in the wrapper's group is what is left.
    if pgid is not None:
        launcher.signal_group(pgid, signal.Signals(signum))


def detect(choice: str, *, state_dir: Path) -> tuple[Runtime | None, str]:
    """The runtime this agent uses and why, or None and why none (said once at the agent's start)."""
    if choice == NONE:
        return None, "containers are off (--container-runtime none): a job naming an image fails"
    binary = shutil.which("runc")
    if binary is None:
        why = "runc is not installed (apt-get install runc)"
    elif os.geteuid() != 0:
        why = "runc needs the agent to run as root"
    else:
        from nodeagent.containers.runc import Runc

        runtime = Runc(binary=binary, root=state_dir / "runc")
        return runtime, f"container runtime: runc ({binary}, state in {runtime.root})"
    if choice == RUNC:
        return None, f"--container-runtime runc: {why}; a job naming an image fails"
    return None, f"no container runtime: {why}; a job naming an image fails"
