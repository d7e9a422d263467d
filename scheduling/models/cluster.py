"""The cluster as the portal knows it: spine -> leaf -> node -> GPU, the GPUs' telemetry windows and XID
events, and the enrolment tokens that let agents register nodes.

Apart from the jobs' models (jobs.py) because it is the supply side: an agent writes these, the
scheduler reads them; jobs.py points here (a task's node, an allocation's GPU), never the reverse.
"""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.utils import timezone


class Spine(models.Model):
    name = models.CharField(max_length=64, unique=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Leaf(models.Model):
    name = models.CharField(max_length=64, unique=True)
    spine = models.ForeignKey(Spine, on_delete=models.PROTECT, related_name="leaves")

    class Meta:
        ordering = ["name"]
        verbose_name_plural = "leaves"

    def __str__(self) -> str:
        return self.name


class NodeState(models.TextChoices):
    READY = "READY", "Ready"
    NOT_READY = "NOT_READY", "Not ready"  # missed heartbeats; may come back
    DRAINING = "DRAINING", "Draining"  # takes no new work (admin or agent asked)
    DOWN = "DOWN", "Down"  # lost: its gangs were requeued, it is fenced when it returns


class Node(models.Model):
    name = models.CharField(max_length=64, unique=True)
    leaf = models.ForeignKey(Leaf, on_delete=models.PROTECT, related_name="nodes")
    address = models.CharField(max_length=255, blank=True, help_text="Host or IP the workloads reach each other on")
    gpu_type = models.CharField(max_length=32, db_index=True)
    state = models.CharField(max_length=10, choices=NodeState.choices, default=NodeState.NOT_READY, db_index=True)
    state_reason = models.CharField(max_length=255, blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    # A drain that outlives a restart or an outage: set by an admin, a critical XID or a task that
    # would not die; only an admin's resume clears it (a node back from DOWN comes back DRAINING).
    hold_reason = models.CharField(max_length=255, blank=True)
    # What the agent last said of its disk ("": room enough) and its clock (seconds ahead of the
    # portal's, as measured; None: not measured yet). A node with a disk problem takes no new work.
    disk_problem = models.CharField(max_length=255, blank=True)
    clock_skew_s = models.FloatField(null=True, blank=True)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    simulated = models.BooleanField(default=False, help_text="GPUs simulated by the agent (--simulate)")
    token_hash = models.CharField(max_length=64, blank=True, db_index=True)
    agent_version = models.CharField(max_length=32, blank=True)
    cpus = models.PositiveIntegerField(default=0)
    memory_mb = models.PositiveIntegerField(default=0)
    registered_at = models.DateTimeField(null=True, blank=True)
    # The multi-node NVLink domain (a GB200 NVL72 rack) the node is in, unique in the cluster; blank: none.
    # Reported by the agent (its --fabric-domain, or NVML's GPU fabric info); its nodes share one leaf.
    fabric_domain = models.CharField(max_length=128, blank=True)
    # The container runtime its agent found ("runc"; blank: none, or an agent that does not say) and the
    # agent's words for it ("container runtime: runc (/usr/sbin/runc, …)", "no container runtime: runc is
    # not installed …"). Only nodes with one take jobs that name an image (docs/containers.md).
    container_runtime = models.CharField(max_length=32, blank=True)
    container_runtime_note = models.CharField(max_length=255, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField()
    uuid = models.CharField(max_length=64, unique=True)
    gpu_type = models.CharField(max_length=32)
    model_name = models.CharField(max_length=100, blank=True)
    memory_mb = models.PositiveIntegerField(default=0)
    # Qualified by the node's name ("<node>/<label>", scheduling/agent/services/registration.py): up to 63 + 1 + 40.
    nvlink_domain = models.CharField(max_length=128)
    pcie_switch = models.CharField(max_length=128)
    numa_node = models.CharField(max_length=128)
    # A MIG instance (NVIDIA Multi-Instance GPU) is a schedulable GPU of its own: its profile ("1g.10gb"),
    # its type the parent's with the profile ("H100.1g.10gb"), and the UUID of the physical GPU it is a
    # slice of. Both blank for a whole GPU.
    mig_profile = models.CharField(max_length=32, blank=True)
    parent_uuid = models.CharField(max_length=64, blank=True)
    healthy = models.BooleanField(default=True)
    # Latest telemetry from the agent (null: the metric failed or was never reported).
    utilization_pct = models.FloatField(null=True, blank=True)
    memory_used_mb = models.FloatField(null=True, blank=True)
    temperature_c = models.FloatField(null=True, blank=True)
    power_w = models.FloatField(null=True, blank=True)
    telemetry_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_node_index")]
        # The few unhealthy GPUs, counted by every submission's admission check (selectors.cluster_capacity).
        indexes = [models.Index(fields=["healthy"], condition=Q(healthy=False), name="gpu_unhealthy")]

    def __str__(self) -> str:
        return f"{self.node.name}/gpu{self.index}"


class GpuWindow(models.Model):
    """Telemetry folded into fixed one-minute windows (as Run:ai measures idleness)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="windows")
    start = models.DateTimeField()
    samples = models.PositiveIntegerField(default=0)
    utilization_sum = models.FloatField(default=0)
    utilization_max = models.FloatField(default=0)
    memory_used_max_mb = models.FloatField(default=0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu", "start"], name="gpuwindow_unique_gpu_start")]
        indexes = [models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"{self.gpu_id} @ {self.start:%H:%M}"

    @property
    def utilization_mean(self) -> float:
        return self.utilization_sum / self.samples if self.samples else 0.0


class XidEvent(models.Model):
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="xid_events")
    time = models.DateTimeField(default=timezone.now)
    code = models.PositiveIntegerField()
    # How many times the code was seen on this GPU in one heartbeat: a storm of one XID is one row.
    count = models.PositiveIntegerField(default=1)

    class Meta:
        ordering = ["-time"]

    def __str__(self) -> str:
        return f"XID {self.code} on GPU {self.gpu_id}"


class EnrolmentToken(models.Model):
    """Lets an agent register new nodes (each node name once): up to ``max_uses`` of them, until it expires.
    Stored hashed. Made with ``manage.py enrolment_token`` (scheduling/agent/enrolment.py)."""

    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A token that leaks must not register nodes without end: by default it registers one.
    max_uses = models.PositiveIntegerField(default=1, help_text="How many nodes it may register")
    uses = models.PositiveIntegerField(default=0, help_text="How many nodes it has registered")
    last_used_at = models.DateTimeField(null=True, blank=True)
    requires_approval = models.BooleanField(
        default=False, help_text="Nodes it registers take no work until a cluster admin approves them"
    )

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(uses__lte=F("max_uses")), name="enrolmenttoken_uses_within_max")]

    def __str__(self) -> str:
        return self.name
