"""Pending reasons a person can act on, and relative time wording."""

from __future__ import annotations

from collections.abc import Iterable

from scheduling.core.free_state import FreeState
from scheduling.core.index import NODE, UNLIMITED, TopoIndex


def job_label(job_id: str, name: str = "") -> str:
    """A job as reasons name it: 'notebook-alice (#471)', or '#471' where it has no name."""
    return f"{name} (#{job_id})" if name else f"#{job_id}"


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


# What a job that needs a node capability (``types.CONTAINERS``…) waits for, and what the nodes that have it have.
CAPABILITY_WORDS = {"containers": ("nodes that run containers", "have a runtime")}


def needs(capabilities: Iterable[str], *, have: int, of: int, gpu_type: str) -> str:
    """'needs nodes that run containers: 2 of 5 H100 nodes have a runtime'."""
    parts = []
    for capability in sorted(capabilities):
        what, verb = CAPABILITY_WORDS.get(capability, (f"nodes with {capability}", f"have {capability}"))
        parts.append(f"{what}: {have} of {of} {gpu_type} nodes {verb}")
    return "needs " + "; ".join(parts)


def memory_words(mib: int) -> str:
    """MiB as people read it: '512 MiB', '16 GiB', '1.5 TiB'."""
    if mib >= 1024 * 1024:
        return f"{mib / (1024 * 1024):.3g} TiB"
    if mib >= 1024:
        return f"{mib / 1024:.4g} GiB"
    return f"{mib} MiB"


def never(
    ix: TopoIndex,
    gpu_type: str,
    replicas: int,
    per_replica: int,
    *,
    cpus: int = 0,
    memory_mb: int = 0,
    one_fabric: bool = False,
    one_per_node: bool = False,
) -> str | None:
    """Why a gang of this shape can never run on this cluster, or None (``one_fabric``: inside one fabric
    domain, unless it fits on one node; ``one_per_node``: each replica on a node of its own)."""
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
    if one_per_node and replicas > 1:
        nodes = sum(1 for ni in ix.type_nodes.get(gpu_type, ()) if len(ix.nodes[ni].gpu_ids) >= per_replica)
        if replicas > nodes:
            return f"needs {replicas} nodes with {per_replica} {gpu_type} each (one replica per node); the cluster has {nodes}"
    if one_fabric and replicas * per_replica > largest:
        most = ix.fabric_replicas_capacity(gpu_type, per_replica)
        if replicas > most:
            if not ix.fabric_names:
                return f"needs one NVLink fabric domain for {replicas} replicas of {per_replica} {gpu_type}; the cluster has none"
            return (
                f"needs {replicas} replicas of {per_replica} {gpu_type} inside one NVLink fabric domain; "
                f"the largest domain holds {most}"
            )
    if ix.limited and (cpus > 0 or memory_mb > 0):
        sizes = [(len(ix.nodes[ni].gpu_ids), ix.ncpu[ni], ix.nmem[ni]) for ni in ix.type_nodes.get(gpu_type, ())]
        return never_resources(sizes, gpu_type, replicas, per_replica, cpus, memory_mb)
    return None


def never_resources(
    sizes: Iterable[tuple[int, int, int]], gpu_type: str, replicas: int, per_replica: int, cpus: int, memory_mb: int
) -> str | None:
    """Why no node (or not enough of them) could ever give a replica its cores and memory, or None.
    ``sizes``: (GPUs, cores, memory) of each node of the type (``index.UNLIMITED`` where not known)."""
    nodes = [n for n in sizes if n[0] >= per_replica]
    most_cpu = max((n[1] for n in nodes), default=0)
    if cpus > most_cpu:
        return (
            f"a replica asks {cpus} CPU cores, but the largest {gpu_type} node gives jobs {most_cpu} "
            f"(its cores less the system reserve); ask at most {most_cpu} per replica, or use more replicas"
        )
    most_mem = max((n[2] for n in nodes), default=0)
    if memory_mb > most_mem:
        return (
            f"a replica asks {memory_words(memory_mb)} of memory, but the largest {gpu_type} node gives jobs "
            f"{memory_words(most_mem)} (its memory less the system reserve); ask at most that per replica"
        )

    def holds(n: tuple[int, int, int]) -> int:
        k = n[0] // per_replica
        if cpus > 0:
            k = min(k, n[1] // cpus)
        if memory_mb > 0:
            k = min(k, n[2] // memory_mb)
        return k

    cap = sum(holds(n) for n in nodes)
    if replicas > cap:
        return (
            f"needs {replicas} replicas of {per_replica} {gpu_type} with {cpus} cores and {memory_words(memory_mb)} "
            f"each; by their cores and memory the cluster's nodes hold at most {cap}"
        )
    return None


def short_of(st: FreeState, gpu_type: str, per_replica: int, cpus: int, memory_mb: int) -> str | None:
    """Where a replica's GPUs are free but its cores or memory are not, said of the node with the most
    free GPUs of the type (e.g. "node h100-03 has 8 free H100 but 12 of 112 cores free; the job asks 16
    per replica"), or None when no such node exists (GPUs are what is short)."""
    ix = st.ix
    if not ix.limited or (cpus <= 0 and memory_mb <= 0):
        return None
    nfree = st.dfree[NODE]
    best: tuple[int, int] | None = None
    for ni in ix.type_nodes.get(gpu_type, ()):
        if nfree[ni] >= per_replica and st.room(ni, per_replica, cpus, memory_mb) == 0:
            key = (-nfree[ni], ni)
            if best is None or key < best:
                best = key
    if best is None:
        return None
    ni = best[1]
    name, gpus = ix.nodes[ni].name, nfree[ni]
    if cpus > st.cfree[ni]:
        return (
            f"node {name} has {gpus} free {gpu_type} but {st.cfree[ni]} of {ix.ncpu[ni]} cores free; "
            f"the job asks {cpus} per replica"
        )
    total = ix.nmem[ni]
    return (
        f"node {name} has {gpus} free {gpu_type} but {memory_words(st.mfree[ni])} of {memory_words(total)} "
        f"memory free; the job asks {memory_words(memory_mb)} per replica"
        if total < UNLIMITED
        else f"node {name} has {gpus} free {gpu_type} but not the memory the job asks"
    )


def blocked(
    st: FreeState,
    gpu_type: str,
    replicas: int,
    per_replica: int,
    *,
    one_leaf: bool = False,
    cpus: int = 0,
    memory_mb: int = 0,
    one_fabric: bool = False,
) -> str:
    """Why a gang of this shape does not fit in the free GPUs of ``st`` now.

    ``one_leaf``: the gang must stay under one leaf switch (``placement.keep_in_leaf``), so the text
    says so and compares with the best leaf, not the cluster; ``one_fabric``: likewise, one fabric domain.
    Where GPUs are free on a node that lacks the cores or memory a replica asks, that is said first
    (``short_of``).
    """
    ix = st.ix
    need = replicas * per_replica
    free = st.type_free.get(gpu_type, 0)
    if free == 0:
        return f"no free {gpu_type} on any READY node ({need} needed)"
    if free < need:
        return f"needs {need} {gpu_type}; {free} free in the cluster"
    short = short_of(st, gpu_type, per_replica, cpus, memory_mb)
    if short is not None:
        return short
    best_node = st.max_node_free(gpu_type)
    if replicas == 1:
        return f"needs {per_replica} free {gpu_type} on one node; best node has {best_node}"
    if one_fabric:
        best_fabric = max((st.fabric_capacity(fi, gpu_type, per_replica) for fi in range(len(st.fab_tfree))), default=0)
        return (
            f"needs {replicas} replicas of {per_replica} {gpu_type} inside one NVLink fabric domain; "
            f"best domain holds {best_fabric}"
        )
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
