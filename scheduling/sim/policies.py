"""The policies a replay can run, by name. All share the core's signature."""

from __future__ import annotations

from scheduling.sim import baselines
from scheduling.sim.engine import Policy

NAMES = ("yardmaster", "fifo", "first-fit", "easy-backfill")
# Policies whose decisions never read a job's time limit: one replay serves both
# --time-limits modes.
LIMIT_BLIND = frozenset({"fifo", "first-fit"})


def make_policy(name: str) -> Policy:
    """A fresh policy (first-fit keeps state across cycles, so never share one)."""
    if name == "yardmaster":
        from scheduling.core.plan import plan

        return plan
    if name == "fifo":
        return baselines.fifo
    if name == "first-fit":
        return baselines.KubeFirstFit()
    if name == "easy-backfill":
        return baselines.easy_backfill
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(NAMES)}")
