"""Cluster (spine -> leaf -> node -> GPU), jobs, tasks, allocations, events, telemetry.

Models hold fields and constraints; the rules live in services.py and scheduling/core.
The database is the last line of defence: a GPU can never have two live allocations.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from scheduling.states import JobState, TaskState
from tenants.models import OrgUnit

# --------------------------------------------------------------------------- cluster


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


# --------------------------------------------------------------------------- jobs


class Tier(models.IntegerChoices):
    PRODUCTION = 1, "1 · production"
    RESEARCH = 2, "2 · research"
    SPOT = 3, "3 · spot"


class JobKind(models.TextChoices):
    BATCH = "batch", "Batch"
    NOTEBOOK = "notebook", "Notebook"


LEAF_LOCALITY_CHOICES = [
    ("auto", "auto: wait for one leaf switch only while that costs less than spanning"),
    ("required", "required: one leaf switch or wait (Slurm --switches=1)"),
    ("preferred", "preferred: one leaf switch if one has room now, else span"),
]


class Job(models.Model):
    name = models.CharField(max_length=200)
    team = models.ForeignKey(OrgUnit, on_delete=models.PROTECT, related_name="jobs")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    tier = models.PositiveSmallIntegerField(choices=Tier.choices, default=Tier.RESEARCH)
    kind = models.CharField(max_length=10, choices=JobKind.choices, default=JobKind.BATCH)
    # gang shape: replicas x gpus_per_replica GPUs of one type, all or nothing
    replicas = models.PositiveIntegerField(default=1)
    gpus_per_replica = models.PositiveIntegerField(default=1)
    gpu_type = models.CharField(max_length=32)
    cpus_per_replica = models.PositiveIntegerField(default=4)
    memory_mb_per_replica = models.PositiveIntegerField(default=16384)
    command = models.TextField(blank=True)
    env = models.JSONField(default=dict, blank=True)
    time_limit_s = models.PositiveIntegerField(default=24 * 3600)
    checkpoint_dir = models.CharField(max_length=1024, blank=True)
    priority = models.IntegerField(default=0)
    # A multi-node gang that one leaf switch could hold: wait for one (required), span at once when no
    # leaf has room (preferred), or weigh the wait against YARD_SPAN_SLOWDOWN (auto).
    leaf_locality = models.CharField(max_length=16, choices=LEAF_LOCALITY_CHOICES, default="auto")
    # All its nodes in one multi-node NVLink domain (Node.fabric_domain), or wait: Slurm's --segment.
    one_fabric = models.BooleanField(default=False)
    # Each replica on a node of its own, never two on one node: Slurm's --nodes=N (N distinct nodes).
    one_per_node = models.BooleanField(default=False)
    # A container image to run in (docs/containers.md), normalised ("docker.io/library/python:3.12");
    # blank: on the host. Its mounts as the agent takes them ({source, target, readonly}) and the working
    # directory inside it (blank: the task's run directory).
    image = models.CharField(max_length=512, blank=True)
    container_mounts = models.JSONField(default=list, blank=True)
    container_workdir = models.CharField(max_length=1024, blank=True)
    # lifecycle
    state = models.CharField(max_length=10, choices=JobState.choices, default=JobState.PENDING, db_index=True)
    attempt = models.PositiveIntegerField(default=1)
    submitted_at = models.DateTimeField(default=timezone.now, db_index=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    state_changed_at = models.DateTimeField(default=timezone.now)
    exit_code = models.IntegerField(null=True, blank=True)
    # what the scheduler said about it last
    pending_reason = models.TextField(blank=True)
    estimated_start = models.DateTimeField(null=True, blank=True)
    reservation_domain = models.CharField(max_length=128, blank=True)  # a node, leaf or fabric domain name
    locality = models.CharField(max_length=16, blank=True)
    leaves_spanned = models.PositiveSmallIntegerField(default=0)
    borrowed = models.BooleanField(default=False, help_text="Runs beyond its team's guarantee: reclaimable")
    # stop orders (cancel, preemption, idle reaping, time limit)
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stop_reason = models.CharField(max_length=32, blank=True)  # CANCELLED, PREEMPTED, IDLE_TIMEOUT, TIME_LIMIT
    stop_grace_s = models.PositiveIntegerField(default=60)
    # The agent's words on why it could not run the job (IMAGE_PULL: which image, and what the registry said).
    stop_message = models.TextField(blank=True)
    last_checkpoint_at = models.DateTimeField(null=True, blank=True)
    # CI retries: the same (user, key) never makes two jobs
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)
    # idle-notebook reaper
    idle_warned_at = models.DateTimeField(null=True, blank=True)
    # the start of the idle spell the warning is about: only use observed from here on withdraws it
    idle_since = models.DateTimeField(null=True, blank=True)
    idle_extended_at = models.DateTimeField(null=True, blank=True)
    copied_from = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-submitted_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="job_unique_idempotency_key_per_user",
            ),
            models.CheckConstraint(condition=Q(replicas__gte=1) & Q(gpus_per_replica__gte=1), name="job_gang_not_empty"),
            models.CheckConstraint(condition=Q(tier__gte=1) & Q(tier__lte=3), name="job_tier_1_to_3"),
        ]
        indexes = [
            models.Index(fields=["team", "state"]),
            models.Index(fields=["user", "state"]),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def gpu_count(self) -> int:
        return self.replicas * self.gpus_per_replica

    @property
    def is_terminal(self) -> bool:
        from scheduling.states import TERMINAL_STATES

        return JobState(self.state) in TERMINAL_STATES


class RegistryCredential(models.Model):
    """A team's (or a department's, for every team below it) login to one container registry.

    The password is kept sealed (scheduling/sealed.py) and opened only to build a task spec for an agent;
    it is never shown, logged or sent back by the API.
    """

    unit = models.ForeignKey(OrgUnit, on_delete=models.CASCADE, related_name="registry_credentials")
    registry = models.CharField(max_length=255, help_text="host[:port], e.g. nvcr.io or registry.corp:5000")
    username = models.CharField(max_length=255)
    password_sealed = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["unit_id", "registry"]
        constraints = [models.UniqueConstraint(fields=["unit", "registry"], name="registrycredential_unique_per_unit")]

    def __str__(self) -> str:
        return f"{self.username}@{self.registry} ({self.unit})"


class JobEvent(models.Model):
    """Every state change of a job, with its reason and who or what caused it."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    time = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveIntegerField(default=1)
    from_state = models.CharField(max_length=10, blank=True)
    to_state = models.CharField(max_length=10, blank=True)  # blank: a note, not a transition
    reason = models.TextField(blank=True)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    actor_label = models.CharField(max_length=100, default="system")

    class Meta:
        ordering = ["time", "id"]

    def __str__(self) -> str:
        return f"{self.job_id}: {self.from_state}→{self.to_state} ({self.reason})"


class Task(models.Model):
    """One replica of one attempt of a job, on one node."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="tasks")
    attempt = models.PositiveIntegerField()
    rank = models.PositiveIntegerField()
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="tasks")
    state = models.CharField(max_length=10, choices=TaskState.choices, default=TaskState.ASSIGNED, db_index=True)
    # The rank-0 node's address (or its name when it has none), written at placement: MASTER_ADDR.
    master_addr = models.CharField(max_length=255, blank=True)
    # The job's rendezvous port at its rank-0 address, picked by the cycle from YARD_RENDEZVOUS_PORTS and
    # unique among the live rank-0 tasks of that address (constraint below): the rendezvous store binds
    # every interface, so nodes that share an address (simulated nodes on one host) share one port
    # space, and two gangs there never meet in one torch.distributed store. Null only for tasks made
    # outside the cycle.
    master_port = models.PositiveIntegerField(null=True, blank=True)
    # The node-local GPU indices this task holds, as the cycle placed them: the heartbeat builds the
    # agent's `desired` list from the task row alone, without a join over allocations per heartbeat.
    gpu_indices = models.JSONField(default=list, blank=True)
    pid = models.IntegerField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    signal = models.IntegerField(null=True, blank=True)
    stopped_by = models.CharField(max_length=10, blank=True)  # "", "sigterm", "sigkill"
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    checkpoint_at = models.DateTimeField(null=True, blank=True)
    notebook_url = models.CharField(max_length=1024, blank=True)
    notebook_kernel_busy = models.BooleanField(null=True, blank=True)
    notebook_last_activity = models.DateTimeField(null=True, blank=True)
    log_size = models.PositiveBigIntegerField(default=0)
    # What the task's processes really use, as its agent last reported (null: not reported yet): CPU
    # cores busy over the last report interval, resident memory now, and the most resident memory seen.
    cpu_used = models.FloatField(null=True, blank=True)
    memory_used_mb = models.FloatField(null=True, blank=True)
    memory_peak_mb = models.FloatField(null=True, blank=True)

    class Meta:
        ordering = ["job_id", "attempt", "rank"]
        constraints = [
            models.UniqueConstraint(fields=["job", "attempt", "rank"], name="task_unique_job_attempt_rank"),
            # One live gang per rendezvous port per address, as the allocation constraint keeps one per GPU.
            models.UniqueConstraint(
                fields=["master_addr", "master_port"],
                condition=Q(rank=0, master_port__isnull=False, state__in=["ASSIGNED", "RUNNING", "STOPPING"]),
                name="task_unique_live_rendezvous_port",
            ),
        ]
        indexes = [models.Index(fields=["node", "state"])]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} rank {self.rank}"


class Allocation(models.Model):
    """A GPU held by a task from ``allocated_at`` until ``released_at`` (null while live)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="allocations")
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="allocations")
    attempt = models.PositiveIntegerField()
    allocated_at = models.DateTimeField(default=timezone.now)
    released_at = models.DateTimeField(null=True, blank=True)
    borrowed = models.BooleanField(default=False)

    class Meta:
        constraints = [
            # The last line of defence: no GPU in two live allocations, whatever the code above does.
            models.UniqueConstraint(fields=["gpu"], condition=Q(released_at__isnull=True), name="allocation_one_live_per_gpu"),
            models.CheckConstraint(
                condition=Q(released_at__isnull=True) | Q(released_at__gte=F("allocated_at")),
                name="allocation_released_after_allocated",
            ),
        ]
        indexes = [models.Index(fields=["job", "attempt"]), models.Index(fields=["allocated_at", "released_at"])]

    def __str__(self) -> str:
        return f"{self.gpu} → job {self.job_id}/{self.attempt}"


class TaskLogChunk(models.Model):
    """A chunk of a task's stdout/stderr as shipped by its agent (at-least-once, keyed by offset)."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="log_chunks")
    offset = models.PositiveBigIntegerField()
    data = models.TextField()

    class Meta:
        ordering = ["task_id", "offset"]
        constraints = [models.UniqueConstraint(fields=["task", "offset"], name="tasklogchunk_unique_task_offset")]

    def __str__(self) -> str:
        return f"task {self.task_id} log @{self.offset}"


class SchedulerLease(models.Model):
    """One row per singleton duty ("cycle"): who holds it, until when, under which epoch.

    Claimed with a conditional UPDATE; every write of a cycle re-checks the epoch so a paused
    old holder's late writes are refused (fencing token).
    """

    name = models.CharField(max_length=32, primary_key=True)
    holder = models.CharField(max_length=128, blank=True)
    epoch = models.PositiveBigIntegerField(default=0)
    expires_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"{self.name} held by {self.holder or '—'} (epoch {self.epoch})"


class LivenessClock(models.Model):
    """The liveness checker's own record (one row, "nodes"): when it last ran, and the disruption guard.

    The checker's own gaps are time the portal could not observe: they become BlindSpells, which node
    silence does not count (docs/agent-api.md, *What the portal counts as silence*).
    """

    name = models.CharField(max_length=32, primary_key=True)
    last_tick = models.DateTimeField(null=True, blank=True)
    # Disruption guard: while a large share of nodes is silent at once, no node is marked lost.
    guard_active = models.BooleanField(default=False)
    guard_reason = models.CharField(max_length=255, blank=True)
    guard_since = models.DateTimeField(null=True, blank=True)
    guarded_leaves = models.JSONField(default=list, blank=True)

    def __str__(self) -> str:
        return f"{self.name}: last tick {self.last_tick}"


class BlindSpell(models.Model):
    """An interval in which the portal could not observe heartbeats (its database, workers or web tier
    were unavailable, or a disruption guard held): node silence inside it is not counted."""

    start = models.DateTimeField()
    end = models.DateTimeField(db_index=True)
    cause = models.CharField(max_length=255)
    # The leaves it covers (a disruption guard held on some leaves); empty: the whole cluster.
    leaves = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-end"]
        constraints = [models.CheckConstraint(condition=Q(end__gte=F("start")), name="blindspell_end_after_start")]

    def __str__(self) -> str:
        return f"{self.start:%H:%M:%S}–{self.end:%H:%M:%S}: {self.cause}"


class JobTemplate(models.Model):
    """A saved job spec a user can submit again."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="job_templates")
    name = models.CharField(max_length=100)
    spec = models.JSONField(default=dict)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["user", "name"], name="jobtemplate_unique_user_name")]

    def __str__(self) -> str:
        return self.name


class IdlePolicy(models.Model):
    """Idle-notebook reaping for a unit's subtree (nearest unit wins) and tier (null: any)."""

    unit = models.ForeignKey(OrgUnit, on_delete=models.CASCADE, related_name="idle_policies")
    tier = models.PositiveSmallIntegerField(choices=Tier.choices, null=True, blank=True)
    timeout_s = models.PositiveIntegerField(default=45 * 60)
    warn_lead_s = models.PositiveIntegerField(default=10 * 60)
    allow_extend = models.BooleanField(default=True)
    extend_s = models.PositiveIntegerField(default=60 * 60)
    utilization_threshold_pct = models.FloatField(default=1.0)
    flag_idle_batch_after_s = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["unit", "tier"], name="idlepolicy_unique_unit_tier")]
        verbose_name_plural = "idle policies"

    def __str__(self) -> str:
        return f"{self.unit} tier {self.tier or 'any'}: {self.timeout_s // 60} min"
