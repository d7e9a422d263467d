"""The admission check at submit time: can this job ever run here, and if so, when?"""

from __future__ import annotations

from dataclasses import replace

from scheduling.core import reasons
from scheduling.core.capacity import quota_refusal
from scheduling.core.index import topo_index
from scheduling.core.plan import plan
from scheduling.core.types import Locality, PendingJob, Placement, Snapshot, Verdict

_LOCALITY_WORDS = {
    Locality.NVLINK: "NVLink domain intact",
    Locality.PCIE: "one PCIe switch",
    Locality.NODE: "one node, across NVLink domains",
    Locality.FABRIC: "one multi-node NVLink fabric domain",
    Locality.LEAF: "one leaf switch",
    Locality.SPINE: "under one spine",
    Locality.CLUSTER: "across spines",
}


def admit(snapshot: Snapshot, job: PendingJob, *, now: float) -> Verdict:
    """ok=False with the reason when ``job`` could never run on this cluster under these quotas;
    otherwise ok=True with where it would fit now or how long it would wait (from ``plan`` with the
    job added to the queue)."""
    never = _never(snapshot, job)
    if never is not None:
        return Verdict(ok=False, reason=never)
    others = tuple(p for p in snapshot.pending if p.job_id != job.job_id)
    result = plan(replace(snapshot, pending=(*others, job)), now=now)
    for placement in result.placements:
        if placement.job_id == job.job_id:
            return Verdict(ok=True, reason=_fits_now(snapshot, placement))
    why = result.pending_reasons.get(job.job_id, "waits for free GPUs")
    start = result.estimated_start.get(job.job_id)
    if start is not None:
        when = reasons.relative(start - now).removeprefix("in ")
        return Verdict(ok=True, reason=f"waits {when}: {why}")
    return Verdict(ok=True, reason=f"waits: {why}")


def _never(snapshot: Snapshot, job: PendingJob) -> str | None:
    if job.replicas <= 0 or job.gpus_per_replica <= 0:
        return "a job needs at least one replica of at least one GPU"
    ix = topo_index(snapshot.topology)
    shape = reasons.never(
        ix,
        job.gpu_type,
        job.replicas,
        job.gpus_per_replica,
        cpus=job.cpus_per_replica,
        memory_mb=job.memory_mb_per_replica,
        one_fabric=job.one_fabric,
        one_per_node=job.one_per_node,
    )
    if shape is not None:
        return shape
    return quota_refusal(snapshot.quotas, job)


def _fits_now(snapshot: Snapshot, placement: Placement) -> str:
    nodes = sorted(set(placement.nodes))
    where = _LOCALITY_WORDS[placement.locality]
    if len(nodes) == 1:
        leaf = next(n.leaf for n in snapshot.topology.nodes if n.name == nodes[0])
        return f"fits now on {leaf} (node {nodes[0]}, {where})"
    return (
        f"fits now on {len(nodes)} nodes ({', '.join(nodes[:4])}{', ...' if len(nodes) > 4 else ''}), "
        f"{placement.leaves} leaf switch(es), {placement.spines} spine(s): {where}"
    )
