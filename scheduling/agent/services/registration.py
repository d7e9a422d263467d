"""Registering a node: its leaf and spine, its GPUs (and MIG instances, labels qualified by the node), its token."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from scheduling.agent.services.reports import NodeExists, Registration
from scheduling.agent.tokens import new_node_token
from scheduling.models import (
    EnrolmentToken,
    Gpu,
    Leaf,
    Node,
    NodeState,
    Spine,
)
from tenants.models import hash_token

# --------------------------------------------------------------------------- registration


def _qualified(node: str, label: str) -> str:
    # NVLink / PCIe / NUMA labels are local to a node ("nvl0"); the scheduler compares them
    # cluster-wide, so they must not collide between nodes.
    return f"{node}/{label}"


@transaction.atomic
def node_register(*, enrolment: EnrolmentToken, registration: Registration, now: datetime | None = None) -> tuple[Node, str]:
    """Create the node (and its spine and leaf if new) with its GPUs; return it with its new token.

    Raises NodeExists for a name already registered: a node token is issued once, and handing a
    second one to whoever holds an enrolment token would let them impersonate a live node.
    """
    now = now or timezone.now()
    reg = registration
    if Node.objects.filter(name=reg.name).exists():
        raise NodeExists(reg.name)
    spine, _ = Spine.objects.get_or_create(name=reg.spine)
    leaf, _ = Leaf.objects.get_or_create(name=reg.leaf, defaults={"spine": spine})
    raw = new_node_token()
    node = Node.objects.create(
        name=reg.name,
        leaf=leaf,
        address=reg.address,
        # The node's whole-GPU type, even when every GPU is split into MIG instances (each Gpu row has its own).
        gpu_type=reg.gpus[0].parent_type if reg.gpus else "",
        # NOT_READY until its first heartbeat: registering says the agent exists, not that it runs.
        state=NodeState.NOT_READY,
        state_reason=f"registered with enrolment token {enrolment.name!r}; waiting for the first heartbeat",
        state_changed_at=now,
        last_heartbeat=now,
        simulated=reg.simulated,
        token_hash=hash_token(raw),
        agent_version=reg.agent_version,
        cpus=reg.cpus,
        memory_mb=reg.memory_mb,
        fabric_domain=reg.fabric_domain,
        container_runtime=reg.container_runtime,
        container_runtime_note=reg.container_runtime_note[:255],
        registered_at=now,
    )
    Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=gpu.index,
            uuid=gpu.uuid,
            gpu_type=gpu.gpu_type,
            model_name=gpu.name,
            memory_mb=gpu.memory_mb,
            nvlink_domain=_qualified(reg.name, gpu.nvlink_domain),
            pcie_switch=_qualified(reg.name, gpu.pcie_switch),
            numa_node=_qualified(reg.name, "numa?" if gpu.numa_node is None else f"numa{gpu.numa_node}"),
            mig_profile=gpu.mig_profile,
            parent_uuid=gpu.parent_uuid,
        )
        for gpu in reg.gpus
    )
    return node, raw
