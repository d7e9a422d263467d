"""Cluster (spine -> leaf -> node -> GPU), jobs, tasks, allocations, events, telemetry.

Models hold fields and constraints; the rules live in services.py and scheduling/core.
The database is the last line of defence: a GPU can never have two live allocations.

One module per side: cluster.py (the supply), jobs.py (the demand and what it is given), duties.py
(the portal's own singleton records). Every model is imported here, so Django finds them all and
callers import ``scheduling.models`` as before.
"""

from scheduling.models.cluster import EnrolmentToken, Gpu, GpuWindow, Leaf, Node, NodeState, Spine, XidEvent
from scheduling.models.duties import BlindSpell, LivenessClock, SchedulerLease
from scheduling.models.jobs import (
    LEAF_LOCALITY_CHOICES,
    Allocation,
    IdlePolicy,
    Job,
    JobArray,
    JobEvent,
    JobKind,
    JobTemplate,
    RegistryCredential,
    Task,
    TaskLogChunk,
    Tier,
)
from scheduling.models.serving import RolloutState, Service, ServiceRevision, ServiceState, ServiceToken, ServiceWindow

__all__ = [
    "LEAF_LOCALITY_CHOICES",
    "Allocation",
    "BlindSpell",
    "EnrolmentToken",
    "Gpu",
    "GpuWindow",
    "IdlePolicy",
    "Job",
    "JobArray",
    "JobEvent",
    "JobKind",
    "JobTemplate",
    "Leaf",
    "LivenessClock",
    "Node",
    "NodeState",
    "RegistryCredential",
    "RolloutState",
    "SchedulerLease",
    "Service",
    "ServiceRevision",
    "ServiceState",
    "ServiceToken",
    "ServiceWindow",
    "Spine",
    "Task",
    "TaskLogChunk",
    "Tier",
    "XidEvent",
]
