"""What the portal accepts in a heartbeat, as the agent must know it: the same bounds as the portal's
scheduling/agent/protocol.py (a test checks that they agree; the agent imports nothing of the portal).

The agent cleans its own readings before it sends them: a reading NVML got wrong (a negative power,
a counter that overflowed, an XID code beyond 2^31) is dropped with a log line, never sent, so one
bad value can never make every later heartbeat fail.
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger("nodeagent")

INT32_MAX = 2**31 - 1
# (low, high) per GPU metric, physical bounds
METRIC_BOUNDS: dict[str, tuple[float, float]] = {
    "utilization_pct": (0.0, 100.0),
    "memory_used_mb": (0.0, 16 * 1024 * 1024.0),
    "temperature_c": (-60.0, 200.0),
    "power_w": (0.0, 10_000.0),
}
# (low, high) of each task's real use in a heartbeat's task report: Linux's most CPUs, 16 TiB.
TASK_USE_BOUNDS: dict[str, tuple[float, float]] = {
    "cpu_used": (0.0, 8192.0),
    "memory_used_mb": (0.0, 16 * 1024 * 1024.0),
    "memory_peak_mb": (0.0, 16 * 1024 * 1024.0),
}
XID_MAX = INT32_MAX
MAX_XIDS_PER_GPU = 100
MAX_GPUS = 128
MAX_TASKS = 1024
MAX_WINDOWS = 4096
EPOCH_MAX = 4_102_444_800.0
# A service replica's report (SERVICE): its URL and the agent's words on it, at most this long.
SERVICE_URL_MAX = 300
SERVICE_MESSAGE_MAX = 1000
# A dev session's report (DEV): its endpoint and host key at most this long, its connections at most this many.
DEV_ENDPOINT_MAX = 300
DEV_HOST_KEY_MAX = 1000
DEV_CONNECTIONS_MAX = 100_000


def clean_metric(name: str, value: Any, *, where: str, bounds: dict[str, tuple[float, float]] = METRIC_BOUNDS) -> float | None:
    """The value if it is a finite number within its bounds, else None (and a log line saying why)."""
    if value is None:
        return None
    low, high = bounds[name]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or not low <= value <= high:
        log.warning("%s: dropping %s=%r (outside %g..%g): the portal would refuse it", where, name, value, low, high)
        return None
    return float(value)


def clean_xids(codes: list[int], *, where: str) -> list[int]:
    """XID codes the portal can store (0..2^31-1), at most MAX_XIDS_PER_GPU of the newest."""
    kept = [c for c in codes if isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= XID_MAX]
    if len(kept) != len(codes):
        log.warning("%s: dropping %d XID code(s) outside 0..%d", where, len(codes) - len(kept), XID_MAX)
    return kept[-MAX_XIDS_PER_GPU:]
