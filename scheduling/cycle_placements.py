"""How the cycle writes a plan's placements: in bulk, a fixed number of statements per batch of gangs
(a cycle that places 4,000 one-GPU jobs writes them in about a second), each gang with a free
rendezvous port at its rank-0 address.

Apart from ``cycle`` (which fences each batch by the lease's epoch and retries a batch that conflicts
gang by gang) because what one batch writes (jobs, events, tasks, allocations, audit rows, ports) is
the bulk of the cycle's writes and reads none of its control flow.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from django.conf import settings
from django.db.models import Q

from scheduling.core.types import Locality, Placement, Snapshot
from scheduling.models import Allocation, Job, JobEvent, Node, Service, Task
from scheduling.selectors import node_name_of
from scheduling.states import TASK_LIVE_STATES, JobState, TaskState
from tenants.models import AuditEntry

LOCALITY_WORDS = {
    Locality.NVLINK: "nvlink",
    Locality.PCIE: "pcie",
    Locality.NODE: "node",
    Locality.FABRIC: "fabric",
    Locality.LEAF: "leaf",
    Locality.SPINE: "spine",
    Locality.CLUSTER: "cluster",
}


def master_address(node: Node) -> str:
    """Where a gang whose rank 0 runs on ``node`` meets (MASTER_ADDR): the node's address, or its name
    when it has none. Rendezvous ports are unique per such address."""
    return node.address or node.name


class _PlacementWriter:
    """Writes placements in bulk: per batch a fixed number of statements, whatever its size."""

    def __init__(self, *, snapshot: Snapshot, placements: tuple[Placement, ...], now: datetime) -> None:
        self.now = now
        self.gpu_index = {g.id: g.index for n in snapshot.topology.nodes for g in n.gpus}
        names = {name for p in placements for name in p.nodes}
        # A core node name may stand for one node's MIG instances of one type ("n1~H100.1g.10gb").
        rows = {n.name: n for n in Node.objects.select_related("leaf").filter(name__in={node_name_of(x) for x in names})}
        self.nodes = {name: rows[node_name_of(name)] for name in names if node_name_of(name) in rows}
        low, high = cast(tuple[int, int], settings.YARD["RENDEZVOUS_PORTS"])
        self.ports = range(low, high + 1)
        self.skipped: dict[int, str] = {}  # job id -> why it was not written (no free rendezvous port)

    def write(self, gangs: list[Placement] | tuple[Placement, ...]) -> list[int]:
        ids = [int(p.job_id) for p in gangs]
        # Locked in id order, as every service locks jobs; only those still PENDING (not cancelled or
        # placed by an older cycle since the snapshot).
        jobs = {j.pk: j for j in Job.objects.select_for_update().filter(pk__in=ids, state=JobState.PENDING).order_by("pk")}
        gangs = [p for p in gangs if int(p.job_id) in jobs]
        if not gangs:
            return []
        ports = self._ports(gangs, jobs)
        gangs = [p for p in gangs if int(p.job_id) in ports]
        tasks: list[Task] = []
        events: list[JobEvent] = []
        audits: list[AuditEntry] = []
        for p in gangs:
            job = jobs[int(p.job_id)]
            leaf_names = sorted({self.nodes[n].leaf.name for n in p.nodes})
            node_names = list(dict.fromkeys(p.nodes))
            locality = LOCALITY_WORDS[p.locality]
            where = f"placed on {', '.join(leaf_names)} (nodes {', '.join(node_names)}, locality {locality})"
            if p.borrowed:
                where += "; runs on borrowed quota (reclaimable)"
            events.append(
                JobEvent(
                    job=job,
                    time=self.now,
                    attempt=job.attempt,
                    from_state=JobState.PENDING,
                    to_state=JobState.STARTING,
                    reason=where,
                    actor_label="scheduler",
                )
            )
            job.state, job.state_changed_at = JobState.STARTING, self.now
            job.locality, job.leaves_spanned, job.borrowed = locality, p.leaves, p.borrowed
            job.pending_reason, job.estimated_start, job.reservation_domain = "", None, ""
            master = self.nodes[p.nodes[0]]
            for rank, (gpu_ids, node_name) in enumerate(zip(p.replicas, p.nodes, strict=True)):
                tasks.append(
                    Task(
                        job=job,
                        attempt=job.attempt,
                        rank=rank,
                        node=self.nodes[node_name],
                        state=TaskState.ASSIGNED,
                        master_addr=master_address(master),
                        master_port=ports[job.pk],
                        gpu_indices=sorted(self.gpu_index[g] for g in gpu_ids),
                        created_at=self.now,
                    )
                )
            audits.append(
                AuditEntry(
                    time=self.now,
                    actor_label="scheduler",
                    action="job.place",
                    object_type="job",
                    object_id=str(job.pk),
                    unit_id=job.team_id,
                    message=where,
                    data={
                        "attempt": job.attempt,
                        "nodes": node_names,
                        "gpus": [list(r) for r in p.replicas],
                        "port": ports[job.pk],
                    },
                )
            )
        # One UPDATE per kind of placement (what differs between gangs is their locality and borrowing;
        # the rest is the same for all), rather than a CASE over every row.
        kinds: dict[tuple[str, int, bool], list[int]] = {}
        for p in gangs:
            job = jobs[int(p.job_id)]
            kinds.setdefault((job.locality, job.leaves_spanned, job.borrowed), []).append(job.pk)
        for (locality, leaves, borrowed), ids in kinds.items():
            Job.objects.filter(pk__in=ids).update(
                state=JobState.STARTING,
                state_changed_at=self.now,
                locality=locality,
                leaves_spanned=leaves,
                borrowed=borrowed,
                pending_reason="",
                estimated_start=None,
                reservation_domain="",
            )
        JobEvent.objects.bulk_create(events)
        Task.objects.bulk_create(tasks)
        by_rank = {(t.job_id, t.rank): t for t in tasks}
        Allocation.objects.bulk_create(
            Allocation(
                gpu_id=int(g),
                task=by_rank[(int(p.job_id), rank)],
                job_id=int(p.job_id),
                attempt=jobs[int(p.job_id)].attempt,
                allocated_at=self.now,
                borrowed=p.borrowed,
            )
            for p in gangs
            for rank, gpu_ids in enumerate(p.replicas)
            for g in gpu_ids
        )
        AuditEntry.objects.bulk_create(audits)
        return [int(p.job_id) for p in gangs]

    def _ports(self, gangs: list[Placement], jobs: dict[int, Job]) -> dict[int, int]:
        """A rendezvous port per gang, free among the live gangs at its rank-0 address; the port of the
        job's previous attempt when it is still free there (a requeued job keeps its MASTER_PORT if it can).

        Per address, not per node: the rendezvous store binds every interface, so nodes that share an
        address (simulated nodes on one host, or one host registered twice) share one port space. A port
        counts as taken at an address when a live rank 0 was given it at that address, or runs on a node
        that has that address now (its address changed since it was placed)."""
        masters = {int(p.job_id): self.nodes[p.nodes[0]] for p in gangs}
        addrs = {job_id: master_address(node) for job_id, node in masters.items()}
        wanted_addrs = set(addrs.values())
        # The nodes at those addresses now, and the masters themselves (their address may have changed).
        node_addr = {n.pk: master_address(n) for n in masters.values()}
        for pk, address, name in Node.objects.filter(Q(address__in=wanted_addrs) | Q(name__in=wanted_addrs)).values_list(
            "pk", "address", "name"
        ):
            node_addr.setdefault(pk, address or name)
        taken: dict[str, set[int]] = {}
        live = Task.objects.filter(
            Q(master_addr__in=wanted_addrs) | Q(node_id__in=set(node_addr)),
            rank=0,
            state__in=TASK_LIVE_STATES,
            master_port__isnull=False,
        ).values_list("master_addr", "node_id", "master_port")
        for addr, node_id, port in live:
            if port is not None:
                taken.setdefault(addr, set()).add(port)
                if node_id in node_addr:
                    taken.setdefault(node_addr[node_id], set()).add(port)
        previous = dict(
            Task.objects.filter(job_id__in=list(masters), rank=0, master_port__isnull=False)
            .order_by("job_id", "attempt")
            .values_list("job_id", "master_port")
        )  # the last attempt's port wins (ordered by attempt)
        # A service that names its port (docs/services.md) serves on that one: its replica waits for it.
        service_ids = {jobs[j].service_id for j in addrs if jobs[j].service_id is not None}
        fixed_ports = dict(Service.objects.filter(pk__in=service_ids, port__isnull=False).values_list("pk", "port"))
        chosen: dict[int, int] = {}
        for job_id, addr in addrs.items():
            used = taken.setdefault(addr, set())
            service_id = jobs[job_id].service_id
            fixed = fixed_ports.get(service_id) if service_id is not None else None
            if fixed is not None:
                if fixed in used:
                    self.skipped[job_id] = (
                        f"waiting for port {fixed} at {addr} (node {masters[job_id].name}): another live job or replica "
                        "serves or meets there; a service without a fixed port gets a free one in $PORT"
                    )
                    continue
                used.add(fixed)
                chosen[job_id] = fixed
                continue
            wanted = previous.get(job_id)
            port = wanted if wanted is not None and wanted in self.ports and wanted not in used else None
            if port is None:
                port = next((q for q in self.ports if q not in used), None)
            if port is None:
                self.skipped[job_id] = (
                    f"waiting for a free rendezvous port at {addr} (rank-0 node {masters[job_id].name}): all of "
                    f"{self.ports.start}-{self.ports.stop - 1} are in use by live jobs there (YARD_RENDEZVOUS_PORTS)"
                )
                continue
            used.add(port)
            chosen[job_id] = port
        for job_id, why in self.skipped.items():
            Job.objects.filter(pk=job_id, state=JobState.PENDING).update(pending_reason=why)
        return chosen
