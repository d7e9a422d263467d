"""Pending reasons a person can act on, and relative time wording."""

from __future__ import annotations

from scheduling.core.index import FreeState, TopoIndex


def relative(seconds: float) -> str:
    """'now', 'in ~40 s', 'in ~40 min', 'in ~2 h 10 min', 'in ~3 d'."""
    if seconds <= 0:
        return "now"
    if seconds < 90:
        return f"in ~{round(seconds)} s"
    minutes = round(seconds / 60)
    if minutes < 90:
        return f"in ~{minutes} min"
    hours, mins = divmod(minutes, 60)
    if hours < 48:
        return f"in ~{hours} h {mins} min" if mins else f"in ~{hours} h"
    return f"in ~{round(hours / 24)} d"


def never(ix: TopoIndex, gpu_type: str, replicas: int, per_replica: int) -> str | None:
    """Why a gang of this shape can never run on this cluster, or None."""
    total = ix.type_total.get(gpu_type, 0)
    if total == 0:
        kinds = ", ".join(ix.gpu_types) or "none"
        return f"the cluster has no {gpu_type} GPUs (it has: {kinds})"
    largest = ix.type_max_node[gpu_type]
    if per_replica > largest:
        return (
            f"a replica needs {per_replica} {gpu_type} on one node, but the largest {gpu_type} node has "
            f"{largest}; split it into more replicas of at most {largest}"
        )
    if replicas * per_replica > total:
        return f"needs {replicas * per_replica} {gpu_type}, the whole cluster has {total}"
    cap = ix.replicas_capacity(gpu_type, per_replica)
    if replicas > cap:
        return f"needs {replicas} replicas of {per_replica} {gpu_type}; the cluster's nodes hold at most {cap}"
    return None


def blocked(st: FreeState, gpu_type: str, replicas: int, per_replica: int, *, one_leaf: bool = False) -> str:
    """Why a gang of this shape does not fit in the free GPUs of ``st`` now.

    ``one_leaf``: the gang must stay under one leaf switch (``placement.keep_in_leaf``), so the text
    says so and compares with the best leaf, not the cluster.
    """
    ix = st.ix
    need = replicas * per_replica
    free = st.type_free.get(gpu_type, 0)
    if free == 0:
        return f"no free {gpu_type} on any READY node ({need} needed)"
    if free < need:
        return f"needs {need} {gpu_type}; {free} free in the cluster"
    best_node = st.max_node_free(gpu_type)
    if replicas == 1:
        return f"needs {per_replica} free {gpu_type} on one node; best node has {best_node}"
    caps = [st.leaf_capacity(li, gpu_type, per_replica) for li in range(len(ix.leaf_names))]
    best_leaf, total = max(caps, default=0), sum(caps)
    if one_leaf:
        leaf = "under one leaf switch"
        if per_replica == ix.type_max_node[gpu_type]:
            return f"needs {replicas} whole nodes of {per_replica} {gpu_type} {leaf}; best leaf has {best_leaf} free"
        return f"needs {replicas} replicas of {per_replica} {gpu_type} {leaf} (each on one node); best leaf holds {best_leaf}"
    if per_replica == ix.type_max_node[gpu_type]:
        return f"needs {replicas} free nodes of {per_replica} {gpu_type}; best leaf has {best_leaf}, the cluster {total}"
    return (
        f"needs {replicas} replicas of {per_replica} {gpu_type} (each on one node); "
        f"best leaf holds {best_leaf}, the cluster {total}; best node has {best_node} free"
    )
