"""What the agent knows of its own node's health beside its GPUs: room on its disk, and its clock.

Both go to the portal in each heartbeat (docs/agent-api.md, *Disk and clock*):

- ``disk_problem``: the state directory (journal, task logs, checkpoints by default) is nearly full,
  or the latest journal write failed. The portal then places nothing new here until it clears, and the
  agent refuses a launch it could not record (the journal is what stops a restarted agent from
  starting a task twice), ending it with ``stop_cause: node_fault`` so that the job is requeued.
- ``clock_offset_s``: how far the portal's clock is ahead of this node's, measured as NTP does from
  each heartbeat's round trip (the portal answers its ``portal_time``), keeping the estimate of the
  fastest round trip among the latest few: its error is at most half that round trip. The portal
  shifts every time the agent reports by it, and shows the node's skew.
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path

# Below this much free space in the state directory the node takes no new work: at most 64 MiB, and
# at most 5 % of a small file system (a 2 MiB tmpfs is full below 256 KiB), never less than 256 KiB.
FLOOR_BYTES = 256 * 1024
CEILING_BYTES = 64 * 1024 * 1024


def low_water_bytes(total_bytes: int) -> int:
    return max(FLOOR_BYTES, min(CEILING_BYTES, total_bytes // 20))


@dataclass
class DiskCheck:
    """Free space under ``path`` and the outcome of the latest journal write."""

    path: Path
    write_error: str | None = None  # the latest journal write failed, with this error; None: it did not

    def wrote(self, error: OSError | None) -> bool:
        """Record a journal write's outcome; True the first time a run of failures begins (log it once)."""
        began = error is not None and self.write_error is None
        self.write_error = None if error is None else f"cannot write the journal: {error.strerror or error}"
        return began

    def problem(self) -> str | None:
        """What is wrong with the disk, in words for an operator, or None."""
        if self.write_error is not None:
            return f"{self.write_error} ({self.path})"
        try:
            stat = os.statvfs(self.path)
        except OSError as exc:
            return f"cannot read the free space of {self.path}: {exc.strerror or exc}"
        free, total = stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize
        if free < low_water_bytes(total):
            return f"{self.path} has {_size(free)} free of {_size(total)}"
        return None


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


class ClockOffset:
    """The portal's clock minus this node's, from round trips (NTP's on-wire estimate and clock filter)."""

    def __init__(self, keep: int = 8) -> None:
        self.samples: deque[tuple[float, float]] = deque(maxlen=keep)  # (half round trip, offset)

    def add(self, *, sent: float, received: float, portal_time: object) -> None:
        """One exchange: the local clock when the request left and when its answer came, and the time the
        portal stamped on its answer (ignored unless it is a number)."""
        if type(portal_time) not in (int, float) or received < sent:
            return
        half = (received - sent) / 2
        self.samples.append((half, float(portal_time) - (sent + half)))  # type: ignore[arg-type]

    @property
    def estimate(self) -> tuple[float, float] | None:
        """(offset, error bound) of the fastest recent round trip, or None before the first."""
        if not self.samples:
            return None
        half, offset = min(self.samples)
        return offset, half
