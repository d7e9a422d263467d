"""What the agent's parts share: one `Node` per agent, made and handed to each part by nodeagent/agent.py.

The parts (identity.py, heartbeat.py, launch.py, stopping.py, shipping.py) never see the Agent: each
gets this Node and, as plain callables, exactly the few things it asks of another part (a Stopper the
Workloads' `finish`, the Workloads the Stopper's `request_stop`, …), wired in agent.py. So no part
imports agent.py, and the parts import one another only one way.

`config` is replaced whole (dataclasses.replace) when the portal's limits change: a part reads
`node.config` each time it needs a value and keeps no copy of it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.config import AgentConfig
from nodeagent.health import ClockOffset, DiskCheck
from nodeagent.journal import TaskRecord
from nodeagent.link import PortalLink
from nodeagent.topology import GpuSource

TaskKey = tuple[int, int]


class AgentFatal(Exception):
    """The agent cannot go on (refused enrolment, name taken…); the message is for the operator."""


@dataclass(eq=False)
class Node:
    """The node one agent speaks for, and what its parts read and write together."""

    config: AgentConfig  # the current one: replaced, never edited, when the portal's limits change
    gpus: GpuSource
    clock: Callable[[], float]
    log: logging.LoggerAdapter[logging.Logger]
    state_dir: Path
    link: PortalLink
    disk: DiskCheck
    clock_offset: ClockOffset
    # Writes the journal (agent.py); False if the disk refused it.
    save: Callable[[], bool]
    # Every task this node knows, live or remembered: the journal's contents.
    records: dict[TaskKey, TaskRecord] = field(default_factory=dict)
    # Something changed that the journal should hold: written at the end of this turn of the loop.
    dirty: bool = False
    # The container runtime found at the start ("runc"; "": none) and the words for it, said to the portal
    # at registration and in every heartbeat: only nodes with one are given jobs that name an image.
    container_runtime: tuple[str, str] = ("", "")
