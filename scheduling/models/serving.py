"""Inference services (docs/services.md): a long-lived, replicated server reached through the portal.

A service is what people edit (its shape, its probes, how it scales); each of its replicas is a Job of
kind "service" (a gang of one or several nodes, placed by the same plan() as any job, never given a time
limit), made and ended by the service controller (scheduling/serving/controller.py). A change of image,
command or environment is a new revision; the controller rolls the replicas over to it one by one.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from tenants.models import OrgUnit


class ServiceState(models.TextChoices):
    ACTIVE = "active", "Active"
    DELETING = "deleting", "Deleting"  # its replicas are being stopped
    DELETED = "deleted", "Deleted"


class RolloutState(models.TextChoices):
    NONE = "", "—"
    PROGRESSING = "progressing", "Progressing"
    COMPLETE = "complete", "Complete"
    ROLLED_BACK = "rolled_back", "Rolled back"


class Service(models.Model):
    name = models.SlugField(max_length=63, help_text="Part of its URL: /services/<team>/<name>/")
    team = models.ForeignKey(OrgUnit, on_delete=models.PROTECT, related_name="services")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="services")
    # Tier 1 (production serving, never preempted) unless a staging service asks for 2 or 3.
    tier = models.PositiveSmallIntegerField(default=1)
    # Replicas: how many there should be now (set by hand, or by the autoscaler between min and max).
    replicas = models.PositiveIntegerField(default=1)
    min_replicas = models.PositiveIntegerField(default=1)
    max_replicas = models.PositiveIntegerField(default=1)
    # Autoscaling (max_replicas > min_replicas): in-flight requests per ready replica, as the proxy measures them.
    target_inflight = models.FloatField(default=4.0)
    scale_cooldown_s = models.PositiveIntegerField(default=60)
    last_scaled_at = models.DateTimeField(null=True, blank=True)
    # Each replica is a gang: nodes_per_replica nodes (tensor-parallel servers span several) of
    # gpus_per_node GPUs each; rank 0 serves HTTP, the proxy and the probes talk to it alone.
    nodes_per_replica = models.PositiveIntegerField(default=1)
    gpus_per_node = models.PositiveIntegerField(default=1)
    gpu_type = models.CharField(max_length=32)
    cpus_per_node = models.PositiveIntegerField(default=4)
    memory_mb_per_node = models.PositiveIntegerField(default=16384)
    # Where the server listens on its node (host networking): null, the port the agent gives it in $PORT
    # (free at that address, as a job's MASTER_PORT is); a number, that port, and a replica waits for a
    # node whose address has it free.
    port = models.PositiveIntegerField(null=True, blank=True)
    # Probes, as Kubernetes' httpGet probes: an answer of 200-399 within timeout_s passes.
    readiness_path = models.CharField(max_length=512, default="/")
    liveness_path = models.CharField(max_length=512, blank=True, help_text="Blank: no liveness probe")
    probe_period_s = models.FloatField(default=2.0)
    probe_timeout_s = models.FloatField(default=1.0)
    failure_threshold = models.PositiveSmallIntegerField(default=3)
    success_threshold = models.PositiveSmallIntegerField(default=1)
    initial_delay_s = models.FloatField(default=0.0)
    # The revision the replicas should run, and the rollout towards it.
    revision = models.PositiveIntegerField(default=1)
    rollout_state = models.CharField(max_length=16, choices=RolloutState.choices, blank=True)
    rollout_from = models.PositiveIntegerField(null=True, blank=True)
    rollout_started_at = models.DateTimeField(null=True, blank=True)
    rollout_message = models.TextField(blank=True)
    # A rollout whose new replicas are not all ready this long after it began is rolled back.
    progress_deadline_s = models.PositiveIntegerField(default=600)
    state = models.CharField(max_length=10, choices=ServiceState.choices, default=ServiceState.ACTIVE, db_index=True)
    created_at = models.DateTimeField(default=timezone.now)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["team_id", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["team", "name"], condition=~Q(state="deleted"), name="service_unique_live_name_per_team"
            ),
            models.CheckConstraint(condition=Q(tier__gte=1) & Q(tier__lte=3), name="service_tier_1_to_3"),
            models.CheckConstraint(
                condition=Q(min_replicas__lte=F("max_replicas"))
                & Q(min_replicas__gte=1)
                & Q(nodes_per_replica__gte=1)
                & Q(gpus_per_node__gte=1),
                name="service_shape_sane",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.team.slug}/{self.name}" if self.team_id else self.name

    @property
    def autoscaled(self) -> bool:
        return self.max_replicas > self.min_replicas


# What a replica is made with beside its revision's image, command and environment: changing any of them
# makes a new revision, rolled out like a new image.
REVISION_SHAPE_FIELDS = (
    "tier", "nodes_per_replica", "gpus_per_node", "gpu_type", "cpus_per_node", "memory_mb_per_node", "port",
    "readiness_path", "liveness_path", "probe_period_s", "probe_timeout_s", "failure_threshold", "success_threshold",
    "initial_delay_s",
)  # fmt: skip


class ServiceRevision(models.Model):
    """What a replica runs: one per change of image, command or environment, numbered from 1."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="revisions")
    number = models.PositiveIntegerField()
    image = models.CharField(max_length=512, blank=True)
    command = models.TextField(blank=True)
    env = models.JSONField(default=dict, blank=True)
    container_mounts = models.JSONField(default=list, blank=True)
    container_workdir = models.CharField(max_length=1024, blank=True)
    # The replica's shape and probes at this revision (Service's fields of REVISION_SHAPE_FIELDS): a
    # rollback restores them with the image, so a rollout that asked for a shape that cannot run undoes it too.
    shape = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["service_id", "number"]
        constraints = [models.UniqueConstraint(fields=["service", "number"], name="servicerevision_unique_number")]

    def __str__(self) -> str:
        return f"{self.service} r{self.number}"


class ServiceToken(models.Model):
    """A bearer token for one service's endpoint (its callers are programs, not people): stored as its
    SHA-256 only, shown once, revocable."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12)
    token_hash = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["service_id", "created_at"]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.name})"


class ServiceWindow(models.Model):
    """What one proxy process saw of one service over one window (YARD_SERVICE_WINDOW_S): requests,
    errors, the time spent in them (busy_s / window = mean in-flight requests, Little's law) and a
    latency histogram (SERVICE_LATENCY_EDGES_MS), from which the portal reads requests/s and p50/p99."""

    service = models.ForeignKey(Service, on_delete=models.CASCADE, related_name="windows")
    start = models.DateTimeField()
    source = models.CharField(max_length=64, help_text="The proxy process (host:pid)")
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    busy_s = models.FloatField(default=0.0)
    latency_counts = models.JSONField(default=list)
    # Per replica job: requests sent to it and time spent in them ({"<job id>": [requests, busy_s]}).
    per_replica = models.JSONField(default=dict)

    class Meta:
        ordering = ["service_id", "start"]
        constraints = [models.UniqueConstraint(fields=["service", "start", "source"], name="servicewindow_unique")]
        indexes = [models.Index(fields=["start"])]

    def __str__(self) -> str:
        return f"{self.service_id} @{self.start:%H:%M:%S} ({self.source})"
