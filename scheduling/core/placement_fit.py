"""A found placement (``Fit``, in index terms) and taking it: what every search of ``placement``,
``placement_node`` and ``placement_span`` returns, and what the plan, backfill and reclaim take.

Apart from the searches so that the modules that only hold or take a fit (``victims``, ``plan_holds``)
need none of them.
"""

from __future__ import annotations

from typing import NamedTuple

from scheduling.core.free_state import FreeState
from scheduling.core.index import TopoIndex
from scheduling.core.types import Locality, Placement

Replica = tuple[int, tuple[int, ...]]  # (node index, GPU positions on that node)


class Fit(NamedTuple):
    """A found placement, in index terms (node indexes, GPU positions).

    A NamedTuple, not a frozen dataclass: one is built for every search that succeeds (thousands
    per plan), and frozen dataclasses are several times slower to construct."""

    replicas: tuple[Replica, ...]  # rank order
    locality: Locality
    domain: str  # the smallest topology domain holding the gang ("n017", a fabric domain, "leaf-3", "spine-1", "cluster")
    leaves: int
    spines: int

    def by_node(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for ni, positions in self.replicas:
            out.setdefault(ni, []).extend(positions)
        return out

    def gpu_ids(self, ix: TopoIndex) -> tuple[str, ...]:
        return tuple(ix.nodes[ni].gpu_ids[p] for ni, positions in self.replicas for p in positions)

    def placement(self, ix: TopoIndex, job_id: str, *, borrowed: bool, at_risk: bool = False) -> Placement:
        nodes = ix.nodes
        return Placement(
            job_id=job_id,
            replicas=tuple(tuple([nodes[ni].gpu_ids[p] for p in pos]) for ni, pos in self.replicas),
            nodes=tuple([nodes[ni].name for ni, _ in self.replicas]),
            locality=self.locality,
            leaves=self.leaves,
            spines=self.spines,
            borrowed=borrowed,
            at_risk=at_risk,
        )


def take_fit(st: FreeState, fit: Fit, cpus: int = 0, memory_mb: int = 0) -> None:
    """Take a fit's GPUs, each replica's ``cpus`` cores and ``memory_mb`` with them."""
    if st.ix.limited:
        for ni, replica in fit.replicas:
            st.carry(ni, replica, cpus, memory_mb)
    if len(fit.replicas) == 1:  # most placements: one replica, one node, nothing to group
        st.take(*fit.replicas[0])
        return
    for ni, positions in fit.by_node().items():
        st.take(ni, positions)
