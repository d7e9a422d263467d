"""The policies a replay can run, by name. All share the core's signature."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from scheduling.core.types import Plan, Snapshot
from scheduling.sim import baselines
from scheduling.sim.replay_types import Policy

# The default set: Yardmaster and the four baselines.
NAMES = ("yardmaster", "fifo", "first-fit", "easy-blind", "easy-topo")
# Yardmaster under other deployment settings, to measure what one of them does (never in the default set):
# the absolute one-leaf rule of before (every gang that fits a leaf waits for one), and backfill at risk
# (off in the deployment and in the default replay).
VARIANTS: dict[str, dict[str, Any]] = {
    "yardmaster-required": {"span_slowdown": math.inf},
    "yardmaster-at-risk": {"backfill_at_risk": True},
}
KNOWN = (*NAMES, *VARIANTS)
BASELINES = ("fifo", "first-fit", "easy-blind", "easy-topo")
# Policies whose decisions never read a job's time limit: one replay serves both
# --time-limits modes.
LIMIT_BLIND = frozenset({"fifo", "first-fit"})
# Names that were given up, with what to say instead of "unknown".
RENAMED = {
    "easy-backfill": "easy-backfill is now easy-blind (EASY backfill whose node choice is blind to leaves and "
    "spines); Slurm's topology-aware EASY (topology/tree) is easy-topo",
}


class _Configured:
    """``plan`` with some of the deployment's settings (``Config``) changed: what an operator would set."""

    def __init__(self, changes: dict[str, Any]) -> None:
        self.changes = changes

    def __call__(self, snapshot: Snapshot, *, now: float) -> Plan:
        from scheduling.core.plan import plan

        return plan(replace(snapshot, config=replace(snapshot.config, **self.changes)), now=now)


def make_policy(name: str) -> Policy:
    """A fresh policy (first-fit keeps state across cycles, so never share one)."""
    if name == "yardmaster":
        from scheduling.core.plan import plan

        return plan
    if name in VARIANTS:
        return _Configured(VARIANTS[name])
    if name == "fifo":
        return baselines.fifo
    if name == "first-fit":
        return baselines.KubeFirstFit()
    if name == "easy-blind":
        return baselines.easy_backfill
    if name == "easy-topo":
        return baselines.easy_backfill_topo
    if name in RENAMED:
        raise ValueError(RENAMED[name])
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(KNOWN)}")


def is_yardmaster(name: str) -> bool:
    return name == "yardmaster" or name in VARIANTS
