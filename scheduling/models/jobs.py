"""Jobs and what they become: a job, its events, its tasks (one per replica and attempt), their GPU
allocations and logs; the registry credentials its image is pulled with, saved templates, idle policies.

Apart from the cluster's models (cluster.py) because it is the demand side, written by the services
as people submit and the cycle places; the database is the last line of defence here: a GPU can never
have two live allocations.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from scheduling.models.cluster import Gpu, Node
from scheduling.states import JobState, TaskState
from tenants.models import OrgUnit


class Tier(models.IntegerChoices):
    PRODUCTION = 1, "1 · production"
    RESEARCH = 2, "2 · research"
    SPOT = 3, "3 · spot"


class JobKind(models.TextChoices):
    BATCH = "batch", "Batch"
    NOTEBOOK = "notebook", "Notebook"
    SERVICE = "service", "Service replica"
    DEV = "dev", "Dev session"


LEAF_LOCALITY_CHOICES = [
    ("auto", "auto: wait for one leaf switch only while that costs less than spanning"),
    ("required", "required: one leaf switch or wait (Slurm --switches=1)"),
    ("preferred", "preferred: one leaf switch if one has room now, else span"),
]


class JobArray(models.Model):
    """A job array (Slurm's --array): one submission of many tasks, each a Job of its own.

    Its id is its first task's job id, as Slurm's SLURM_ARRAY_JOB_ID; the tasks' own rows say their index.
    """

    id = models.BigIntegerField(primary_key=True)
    # The indices as submitted, normalised ("0-999:2", "1,3,5-7"), without the limit.
    indices = models.CharField(max_length=1000)
    task_count = models.PositiveIntegerField()
    # Slurm's %N: the most of its tasks running at once (the cycle places no more); null: no limit.
    max_running = models.PositiveIntegerField(null=True, blank=True)
    submitted_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(max_running__isnull=True) | Q(max_running__gte=1), name="jobarray_max_running_positive"
            )
        ]

    def __str__(self) -> str:
        return f"array {self.pk} [{self.text}]"

    @property
    def text(self) -> str:
        """As sbatch's --array takes it: "0-999%50"."""
        return self.indices + (f"%{self.max_running}" if self.max_running is not None else "")


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
    time_limit_s = models.PositiveIntegerField(default=24 * 3600)  # 0: none (a service's replicas)
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
    # A service's replica (kind "service", docs/services.md): its service, the revision it runs, and when
    # the controller took it out of the proxy's rotation before stopping it (scale-down, rollout).
    service = models.ForeignKey(
        "scheduling.Service", null=True, blank=True, on_delete=models.PROTECT, related_name="replica_jobs"
    )
    service_revision = models.PositiveIntegerField(null=True, blank=True)
    drain_started_at = models.DateTimeField(null=True, blank=True)
    # A task of a job array (docs: "Job arrays"): its array and its index in it (SLURM_ARRAY_TASK_ID).
    array = models.ForeignKey(JobArray, null=True, blank=True, on_delete=models.CASCADE, related_name="tasks")
    array_index = models.PositiveIntegerField(null=True, blank=True)

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
            models.UniqueConstraint(
                fields=["array", "array_index"], condition=Q(array__isnull=False), name="job_unique_array_index"
            ),
        ]
        indexes = [
            models.Index(fields=["team", "state"]),
            models.Index(fields=["user", "state"]),
            models.Index(fields=["array", "state"], condition=Q(array__isnull=False), name="job_array_state"),
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
    # A service replica's rank 0 as its agent reports it: where it serves (http://address:port), whether
    # its readiness probe passes, how often the agent restarted it in place, and whether it crash-loops.
    service_url = models.CharField(max_length=300, blank=True)
    service_ready = models.BooleanField(null=True, blank=True)
    service_restarts = models.PositiveIntegerField(default=0)
    service_last_restart_at = models.DateTimeField(null=True, blank=True)
    service_crash_looping = models.BooleanField(default=False)
    service_message = models.CharField(max_length=1000, blank=True)
    # A dev session's sshd as its agent reports it (docs/dev-sessions.md): where the portal's SSH tunnel
    # connects (address:port, reachable from the portal only), the per-session host key the CLI pins,
    # the SSH connections open now and the newest activity on them.
    dev_endpoint = models.CharField(max_length=300, blank=True)
    dev_login = models.CharField(max_length=64, blank=True)  # the account sshd lets in
    dev_host_key = models.CharField(max_length=1000, blank=True)
    dev_connections = models.PositiveIntegerField(null=True, blank=True)
    dev_last_activity = models.DateTimeField(null=True, blank=True)
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
