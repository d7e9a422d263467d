"""Which container runtime this node has, and a task's container found again from the journal.

``detect`` picks the runtime at the agent's start (said once in its log). The journal keeps
``Runtime.ref(container_id)`` for each container task, a small dict from which ``from_ref`` rebuilds
the runtime: the node's watchdog (a separate process) and a restarted agent stop or adopt a container
by it without any other state. ``signal_task`` signals a task whatever its kind.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

from nodeagent import launcher
from nodeagent.containers.base import NONE, RUNC, Runtime
from nodeagent.containers.runc import Runc


def from_ref(ref: dict[str, Any] | None) -> tuple[Runtime, str] | None:
    """The runtime and container id a journal entry names, or None (no container, unknown runtime)."""
    if not ref or ref.get("runtime") != RUNC:
        return None
    return Runc(binary=str(ref["binary"]), root=Path(str(ref["root"]))), str(ref["id"])


def signal_task(ref: dict[str, Any] | None, pgid: int | None, signum: int) -> None:
    """Signal a task the way its kind needs: a host task's process group; a container's processes
    through its runtime. SIGTERM goes to the container's processes only (its runtime, in the
    wrapper's group, would forward a second one to the container's init); SIGKILL to both, the
    container first, so no process of it outlives its runtime."""
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
        runtime = Runc(binary=binary, root=state_dir / "runc")
        return runtime, f"container runtime: runc ({binary}, state in {runtime.root})"
    if choice == RUNC:
        return None, f"--container-runtime runc: {why}; a job naming an image fails"
    return None, f"no container runtime: {why}; a job naming an image fails"
