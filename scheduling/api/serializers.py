"""Small input and output serializers, one per operation. No ORM writes here: views call services."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from scheduling import images
from scheduling.api.fields_once import FieldsBuiltOnce
from scheduling.models import LEAF_LOCALITY_CHOICES, Job, JobEvent, JobKind, Task, Tier
from scheduling.selectors import can_manage_job
from scheduling.services import MAX_GPUS_PER_REPLICA, MAX_REPLICAS, MAX_TIME_LIMIT_S, array_spec_parse
from scheduling.states import JobState, TaskState

_NO_NUL = [ProhibitNullCharactersValidator()]


# --------------------------------------------------------------------------- input


class TeamRefField(serializers.CharField):
    """A team by id or slug (CI scripts know slugs; the UI knows ids)."""


_MOUNT_SCHEMA = {
    "type": "object",
    "properties": {
        "source": {"type": "string", "maxLength": images.MAX_PATH},
        "target": {"type": "string", "maxLength": images.MAX_PATH},
        "readonly": {"type": "boolean"},
    },
    "required": ["source"],
}


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "maxLength": 100_000, "description": "pyxis's SRC:DST[:ro|rw],..."},
            {"type": "array", "items": {"oneOf": [_MOUNT_SCHEMA, {"type": "string"}]}, "maxItems": images.MAX_MOUNTS},
        ],
        "description": "Host paths mounted in the job's container: pyxis's SRC:DST[:ro|rw],... or a list of "
        "{source, target, readonly}; absolute paths without '..'. Needs an image.",
    }
)
class ContainerMountsField(serializers.Field):  # type: ignore[type-arg]
    """Mounts as the agent takes them, from a list or from pyxis's --container-mounts text."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        if isinstance(data, str) and len(data) > 100_000:
            raise serializers.ValidationError("At most 100000 characters")
        try:
            return images.parse_mounts(data)
        except images.ImageError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value: Any) -> Any:
        return value


class ContainerFieldsIn(serializers.Serializer[Any]):
    """A job's container image, mounts and working directory (docs/containers.md, "What a user writes")."""

    image = serializers.CharField(
        max_length=images.MAX_REF,
        allow_blank=True,
        default="",
        validators=_NO_NUL,
        help_text="A container image to run every replica in, e.g. nvcr.io/nvidia/pytorch:24.05-py3 (Docker's "
        "normalisation: python:3.12 is docker.io/library/python:3.12); empty: on the nodes' own environment",
    )
    container_mounts = ContainerMountsField(default=list)
    container_workdir = serializers.CharField(
        max_length=images.MAX_PATH,
        allow_blank=True,
        default="",
        validators=_NO_NUL,
        help_text="The working directory inside the container (absolute); empty: the task's run directory",
    )

    def validate_image(self, value: str) -> str:
        if not value.strip():
            return ""
        try:
            return str(images.parse_image(value))
        except images.ImageError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_container_workdir(self, value: str) -> str:
        try:
            return images.check_workdir(value)
        except images.ImageError as exc:
            raise serializers.ValidationError(str(exc)) from None


class JobSubmitIn(FieldsBuiltOnce, ContainerFieldsIn):
    name = serializers.CharField(max_length=200, validators=_NO_NUL)
    team = TeamRefField(max_length=100, validators=_NO_NUL, help_text="Team id or slug")
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.RESEARCH)
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, default=1)
    gpus_per_replica = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_REPLICA, default=1)
    gpu_type = serializers.CharField(max_length=32, default="H100", validators=_NO_NUL)
    command = serializers.CharField(
        max_length=100_000,
        trim_whitespace=False,
        validators=_NO_NUL,
        help_text="What each replica runs (a shell command line), e.g. torchrun --nproc-per-node 8 train.py",
        error_messages={
            "required": "A batch job needs a command: what each replica runs, e.g. torchrun --nproc-per-node 8 train.py",
            "blank": "A batch job needs a command: what each replica runs, e.g. torchrun --nproc-per-node 8 train.py",
        },
    )
    env = serializers.DictField(
        child=serializers.CharField(max_length=10_000, allow_blank=True, trim_whitespace=False, validators=_NO_NUL),
        default=dict,
    )
    time_limit_s = serializers.IntegerField(min_value=60, max_value=MAX_TIME_LIMIT_S, required=False, allow_null=True)
    checkpoint_dir = serializers.CharField(max_length=1024, allow_blank=True, default="", validators=_NO_NUL)
    priority = serializers.IntegerField(min_value=-1000, max_value=1000, default=0)
    leaf_locality = serializers.ChoiceField(
        choices=LEAF_LOCALITY_CHOICES,
        default="auto",
        help_text="A multi-node gang that one leaf switch could hold: wait for one leaf only while that costs "
        "less than spanning (auto), always (required), or never when none has room now (preferred)",
    )
    one_fabric = serializers.BooleanField(
        default=False,
        help_text="Keep a multi-node gang inside one multi-node NVLink domain (an NVL72 rack), or wait (Slurm's --segment)",
    )
    one_per_node = serializers.BooleanField(
        default=False,
        help_text="Place each replica on a node of its own, never two on one node (Slurm's --nodes=N: N distinct nodes)",
    )
    cpus_per_replica = serializers.IntegerField(
        min_value=1,
        max_value=1024,
        required=False,
        allow_null=True,
        help_text="CPU cores each replica is given on its node (left out: YARD_DEFAULT_CPUS_PER_GPU per GPU)",
    )
    memory_mb_per_replica = serializers.IntegerField(
        min_value=1,
        max_value=16 * 1024 * 1024,
        required=False,
        allow_null=True,
        help_text="Memory (MiB) each replica is given on its node (left out: YARD_DEFAULT_MEMORY_MB_PER_GPU per GPU)",
    )
    array = serializers.CharField(
        max_length=1000,
        required=False,
        allow_blank=True,
        validators=_NO_NUL,
        help_text="A job array, as sbatch's --array: indices 0-999, 1,3,5-7 or 0-99:2, and %N for at most N tasks "
        "running at once (0-999%50). Each index becomes a job of its own with YARD_ARRAY_TASK_ID set; the answer "
        "is the array (its id is its first task's job id). Empty: one job",
    )

    def validate_array(self, value: str) -> str:
        if not value.strip():
            return ""
        try:
            return array_spec_parse(value).text
        except DjangoValidationError as exc:
            raise serializers.ValidationError(exc.message_dict["array"]) from None


class NotebookSubmitIn(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, validators=_NO_NUL)
    image = serializers.CharField(
        max_length=images.MAX_REF,
        allow_blank=True,
        default="",
        validators=_NO_NUL,
        help_text="A container image to run Jupyter in (it needs `jupyter` on its PATH and a kernel); empty: the node's own",
    )
    team = TeamRefField(max_length=100, validators=_NO_NUL, help_text="Team id or slug")
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.RESEARCH)
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_REPLICA, default=1)
    gpu_type = serializers.CharField(max_length=32, default="H100", validators=_NO_NUL)
    time_limit_s = serializers.IntegerField(min_value=60, max_value=MAX_TIME_LIMIT_S, required=False, allow_null=True)


class DevSessionSubmitIn(serializers.Serializer[Any]):
    """A dev session (docs/dev-sessions.md): launched as a notebook is; its node runs sshd, not a command."""

    name = serializers.CharField(
        max_length=200, allow_blank=True, default="", validators=_NO_NUL, help_text="Empty: dev-<your username>"
    )
    team = TeamRefField(max_length=100, validators=_NO_NUL, help_text="Team id or slug")
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.RESEARCH)
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_REPLICA, default=1)
    gpu_type = serializers.CharField(max_length=32, default="H100", validators=_NO_NUL)
    time_limit_s = serializers.IntegerField(min_value=60, max_value=MAX_TIME_LIMIT_S, required=False, allow_null=True)
    cpus = serializers.IntegerField(
        min_value=1, max_value=1024, required=False, allow_null=True, help_text="CPU cores (left out: the default per GPU)"
    )
    memory_mb = serializers.IntegerField(
        min_value=1,
        max_value=16 * 1024 * 1024,
        required=False,
        allow_null=True,
        help_text="Memory in MiB (left out: the default per GPU)",
    )
    image = serializers.CharField(
        max_length=images.MAX_REF,
        allow_blank=True,
        default="",
        validators=_NO_NUL,
        help_text="A container image to run the session's SSH server in (it needs OpenSSH's sshd, openssh-server); "
        "empty: the node's own environment",
    )


class QueryIn(serializers.Serializer[Any]):
    """Query parameters: one given empty (``?since=``) is an error naming it, not the same as leaving it out.

    DRF reads an empty query value as "not given" for most fields, which answers 200 to what the schema
    calls invalid (a date-time, an integer): say what to change instead.
    """

    def to_internal_value(self, data: Any) -> Any:
        if hasattr(data, "getlist"):
            empty: dict[str, list[str]] = {
                str(name): ["Give a value, or leave the parameter out"]
                for name in self.fields
                if name in data and not any(data.getlist(name))
            }
            if empty:
                raise serializers.ValidationError(empty)
        return super().to_internal_value(data)


class JobListFilterIn(QueryIn):
    state = serializers.MultipleChoiceField(choices=JobState.choices, required=False, help_text="One or more, comma-separated")
    team = TeamRefField(max_length=100, required=False, validators=_NO_NUL, help_text="Team id or slug")
    user = serializers.CharField(max_length=150, required=False, validators=_NO_NUL, help_text="Username")
    tier = serializers.ChoiceField(choices=Tier.choices, required=False)
    since = serializers.DateTimeField(required=False, help_text="Submitted at or after (ISO 8601)")
    array = serializers.IntegerField(min_value=1, max_value=2**62, required=False, help_text="The tasks of this job array")
    # Read by the paginator (JobCursor); here so that an empty one is an error like any other parameter's.
    cursor = serializers.CharField(max_length=1000, required=False)
    page_size = serializers.IntegerField(min_value=1, max_value=200, required=False)

    def to_internal_value(self, data: Any) -> Any:
        # ?state=PENDING,RUNNING as well as ?state=PENDING&state=RUNNING
        if hasattr(data, "getlist") and "state" in data:
            data = data.copy()
            states = [s for v in data.getlist("state") for s in v.split(",") if s]
            data.setlist("state", states)
        return super().to_internal_value(data)


class JobLogsIn(QueryIn):
    rank = serializers.IntegerField(min_value=0, max_value=MAX_REPLICAS, default=0)
    attempt = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False)
    offset = serializers.IntegerField(min_value=0, max_value=2**62, required=False, help_text="Text from this byte on")
    tail = serializers.IntegerField(min_value=0, max_value=10_000, required=False, help_text="The last N lines")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "offset" in attrs and "tail" in attrs:
            raise serializers.ValidationError({"tail": ["Give either offset or tail, not both"]})
        return attrs


# --------------------------------------------------------------------------- output


class TeamRefOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    slug = serializers.CharField()
    name = serializers.CharField()


class JobOut(FieldsBuiltOnce, serializers.ModelSerializer[Any]):
    team = TeamRefOut()
    user = serializers.CharField(source="user.username")
    gpus = serializers.IntegerField(source="gpu_count")

    class Meta:
        model = Job
        fields = [
            "id", "name", "kind", "state", "team", "user", "tier", "replicas", "gpus_per_replica", "gpus", "gpu_type",
            "priority", "leaf_locality", "one_fabric", "one_per_node", "cpus_per_replica", "memory_mb_per_replica", "attempt",
            "submitted_at", "started_at", "ended_at", "pending_reason", "estimated_start", "locality", "borrowed", "exit_code",
            "image", "array_id", "array_index",
        ]  # fmt: skip


class TaskOut(FieldsBuiltOnce, serializers.ModelSerializer[Any]):
    node = serializers.CharField(source="node.name")
    leaf = serializers.CharField(source="node.leaf.name")
    gpu_indexes = serializers.SerializerMethodField()

    class Meta:
        model = Task
        fields = [
            "id", "rank", "attempt", "state", "node", "leaf", "gpu_indexes", "master_addr", "master_port",
            "started_at", "ended_at", "exit_code", "signal", "stopped_by",
        ]  # fmt: skip

    def get_gpu_indexes(self, task: Task) -> list[int]:
        return sorted(a.gpu.index for a in task.allocations.all())


class EventOut(serializers.ModelSerializer[Any]):
    class Meta:
        model = JobEvent
        fields = ["time", "attempt", "from_state", "to_state", "reason", "actor_label"]


class DevSshOut(serializers.Serializer[Any]):
    """How to reach a running dev session's sshd: through the portal's websocket tunnel (``yard ssh <id>``)."""

    user = serializers.CharField(
        help_text="The account to log in as, as the session's agent reported it: the owner's under --run-as-owner, "
        "else the agent's own (root for an agent run as root). The owner's username until the agent has said"
    )
    host_key = serializers.CharField(
        allow_blank=True, help_text="The session's SSH host public key, to pin ('' until its sshd reports it)"
    )
    proxy_path = serializers.CharField(help_text="The tunnel's path on the portal's ASGI server: /dev-sessions/<id>/ssh")
    proxy_url = serializers.CharField(help_text="The tunnel's websocket URL (ws:// or wss://); the owner only")
    connections = serializers.IntegerField(allow_null=True, help_text="SSH connections open now, as its agent last reported")
    last_activity = serializers.DateTimeField(allow_null=True, help_text="The newest activity on any of them")


class JobDetailOut(JobOut):
    tasks = serializers.SerializerMethodField()
    events = EventOut(many=True)
    notebook_url = serializers.SerializerMethodField()
    ssh = serializers.SerializerMethodField(help_text="A running dev session's SSH access; null for any other job")

    class Meta(JobOut.Meta):
        fields = [
            *JobOut.Meta.fields,
            "command", "env", "time_limit_s", "checkpoint_dir", "reservation_domain", "leaves_spanned",
            "stop_requested_at", "stop_reason", "stop_message", "last_checkpoint_at", "tasks", "events", "notebook_url",
            "container_mounts", "container_workdir", "ssh",
        ]  # fmt: skip

    def get_tasks(self, job: Job) -> list[dict[str, Any]]:
        tasks = [t for t in job.tasks.all() if t.attempt == job.attempt]
        return TaskOut(tasks, many=True).data  # type: ignore[return-value]

    def get_notebook_url(self, job: Job) -> str | None:
        """Where the viewer opens the notebook in a browser: the portal's notebook proxy (no token in it), for
        those who may open it (owner, team lead, admin), while it runs and its server answers; else null."""
        viewer = self.context.get("viewer")
        if job.kind != JobKind.NOTEBOOK or job.state != JobState.RUNNING or viewer is None:
            return None
        ready = any(
            t.attempt == job.attempt and t.state == TaskState.RUNNING and t.notebook_url and t.notebook_kernel_busy is not None
            for t in job.tasks.all()
        )
        if not ready or not can_manage_job(user=viewer, job=job):
            return None
        path = f"/notebooks/{job.pk}/lab/"
        base = str(getattr(settings, "YARD_NOTEBOOK_URL", "") or "")
        request = self.context.get("request")
        if base:
            return base.rstrip("/") + path
        return request.build_absolute_uri(path) if request is not None else path

    @extend_schema_field(DevSshOut(allow_null=True))
    def get_ssh(self, job: Job) -> dict[str, Any] | None:
        """A dev session's SSH access while it runs and its sshd has reported where it listens; else null."""
        if job.kind != JobKind.DEV or job.state != JobState.RUNNING:
            return None
        task = next(
            (t for t in job.tasks.all() if t.attempt == job.attempt and t.state == TaskState.RUNNING and t.dev_endpoint), None
        )
        if task is None:
            return None
        return dict(DevSshOut(dev_ssh(job, task)).data)


def dev_ssh(job: Job, task: Task) -> dict[str, Any]:
    """The ``ssh`` object of a running dev session (docs/dev-sessions.md), for the API and the session's page.

    ``user`` is the account sshd lets in, as the agent reports it (Task.dev_login): the owner's where agents run
    jobs as their owners, else the agent's own. An agent that has not said (an older one) runs sessions as the
    owner's account only under --run-as-owner; the owner's username is the best guess then, and DevSshOut says so."""
    path = f"/dev-sessions/{job.pk}/ssh"
    base = str(getattr(settings, "YARD_NOTEBOOK_URL", "") or "") or str(settings.YARD_NOTIFY["PUBLIC_URL"])
    base = base.rstrip("/")
    if base.startswith("https://"):
        base = "wss://" + base.removeprefix("https://")
    elif base.startswith("http://"):
        base = "ws://" + base.removeprefix("http://")
    return {
        "user": task.dev_login or job.user.get_username(),
        "host_key": task.dev_host_key,
        "proxy_path": path,
        "proxy_url": base + path,
        "connections": task.dev_connections,
        "last_activity": task.dev_last_activity,
    }


class JobLogsOut(serializers.Serializer[Any]):
    job = serializers.IntegerField()
    rank = serializers.IntegerField()
    attempt = serializers.IntegerField()
    task_state = serializers.CharField(allow_null=True)
    offset = serializers.IntegerField(help_text="Byte offset the text starts at")
    next_offset = serializers.IntegerField(help_text="Pass as ?offset= to follow the log")
    text = serializers.CharField(allow_blank=True)


class QuotaLineOut(serializers.Serializer[Any]):
    gpu_type = serializers.CharField()
    guaranteed = serializers.IntegerField()
    limit = serializers.IntegerField(allow_null=True)
    used = serializers.IntegerField(help_text="GPUs the team's running jobs hold now")
    borrowed = serializers.IntegerField(help_text="GPUs the team holds beyond its guarantee: max(0, used - guaranteed)")
    reclaimable = serializers.IntegerField(
        help_text="GPUs of the team's jobs that run on borrowed quota (a gang is reclaimed whole, so this can exceed borrowed)"
    )


class TeamQuotaOut(serializers.Serializer[Any]):
    team = TeamRefOut()
    quotas = QuotaLineOut(many=True)


class MembershipOut(serializers.Serializer[Any]):
    unit = TeamRefOut()
    kind = serializers.CharField()
    role = serializers.CharField()


class MeOut(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    username = serializers.CharField()
    is_cluster_admin = serializers.BooleanField()
    auth = serializers.CharField(help_text="session, personal token or service token")
    teams = TeamRefOut(many=True, help_text="Teams you may submit to")
    roles = MembershipOut(many=True)


# --------------------------------------------------------------------------- job files, rerun, my quota


class JobFileIn(serializers.Serializer[Any]):
    """POST /api/v1/jobs as JSON with a ``format``: a job file's text, translated on the server (docs/job-files.md)."""

    format = serializers.ChoiceField(
        choices=["yardmaster", "pytorchjob", "mpijob", "slurm", "auto"],
        help_text="yardmaster (a Yardmaster job file), pytorchjob or mpijob (a kubeflow.org/v1 manifest), slurm (an sbatch "
        "script), auto (a YAML/JSON file: by its apiVersion and kind)",
    )
    file = serializers.CharField(
        max_length=1024 * 1024, trim_whitespace=False, validators=_NO_NUL, help_text="The file's text, as it is"
    )
    team = TeamRefField(max_length=100, required=False, validators=_NO_NUL, help_text="The team, where the file names none")
    name = serializers.CharField(max_length=200, required=False, validators=_NO_NUL, help_text="The name, if the file has none")


class JobSubmitOut(JobDetailOut):
    """The job as submitted, with what the translation of a job file had to say."""

    translated_from = serializers.SerializerMethodField(help_text="The job file's format, or null for the API's own JSON")
    warnings = serializers.SerializerMethodField(help_text="What the job file asked for that Yardmaster ignores, and why")

    class Meta(JobDetailOut.Meta):
        fields = [*JobDetailOut.Meta.fields, "translated_from", "warnings"]

    def get_translated_from(self, job: Job) -> str | None:
        return self.context.get("translated_from")

    def get_warnings(self, job: Job) -> list[str]:
        return list(self.context.get("warnings", []))


class MyQuotaIn(QueryIn):
    team = TeamRefField(max_length=100, required=False, validators=_NO_NUL, help_text="One of your teams (id or slug)")


class FairShareOut(serializers.Serializer[Any]):
    rank = serializers.IntegerField(help_text="Place in fair-share order among all teams: 1 is served first")
    teams = serializers.IntegerField(help_text="How many teams there are")
    usage_gpu_hours = serializers.DictField(child=serializers.FloatField(), help_text="Recent use per GPU type, decayed")
    usage_share = serializers.DictField(child=serializers.FloatField(), help_text="Part of all teams' recent use")
    weight = serializers.FloatField()


class MyTeamQuotaOut(serializers.Serializer[Any]):
    team = TeamRefOut()
    quotas = QuotaLineOut(many=True)
    fair_share = FairShareOut(allow_null=True)


class MyQuotaOut(serializers.Serializer[Any]):
    teams = MyTeamQuotaOut(many=True)
    half_life_days = serializers.FloatField(help_text="Half-life of the usage decay")


class JobArrayOut(serializers.Serializer[Any]):
    """A job array: its tasks are jobs (GET /api/v1/jobs?array={id}); this is the array as one."""

    id = serializers.IntegerField(help_text="The array's id: its first task's job id (Slurm's SLURM_ARRAY_JOB_ID)")
    name = serializers.CharField()
    team = TeamRefOut()
    user = serializers.CharField()
    array = serializers.CharField(help_text="As sbatch's --array takes it: 0-999%50")
    task_count = serializers.IntegerField()
    max_running = serializers.IntegerField(allow_null=True, help_text="The most tasks running at once; null: no limit")
    states = serializers.DictField(child=serializers.IntegerField(), help_text="Its tasks per state")
    submitted_at = serializers.DateTimeField()
    tasks = serializers.CharField(help_text="Where its tasks are listed")


class JobArraySubmitOut(JobArrayOut):
    verdict = serializers.CharField(help_text="The admission verdict, checked once for every task (all have one shape)")
    translated_from = serializers.CharField(allow_null=True, help_text="The job file's format, or null for the API's own JSON")
    warnings = serializers.ListField(child=serializers.CharField())


class JobArrayThrottleIn(serializers.Serializer[Any]):
    max_running = serializers.IntegerField(
        min_value=1,
        max_value=1_000_000,
        allow_null=True,
        required=False,
        help_text="The most tasks of the array running at once (the %N of --array); null: no limit; left out: unchanged",
    )


class JobArrayCancelOut(JobArrayOut):
    cancelled = serializers.IntegerField(help_text="Tasks this request cancelled (pending) or told to stop (running)")


class JobPreviewOut(serializers.Serializer[Any]):
    ok = serializers.BooleanField(help_text="false: the job can never run here (verdict says why)")
    fits_now = serializers.BooleanField(help_text="It would be placed at the next cycle")
    verdict = serializers.CharField(help_text="Where it fits now, how long it would wait and why, or why it can never run")
    job = serializers.DictField(help_text="The job's fields as they would be submitted (for a job file: its translation)")
    translated_from = serializers.CharField(allow_null=True)
    warnings = serializers.ListField(child=serializers.CharField())
