"""Small input and output serializers, one per operation. No ORM writes here: views call services."""

from __future__ import annotations

from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers

from scheduling.models import Job, JobEvent, JobKind, Task, Tier
from scheduling.services import MAX_GPUS_PER_REPLICA, MAX_REPLICAS, MAX_TIME_LIMIT_S
from scheduling.states import JobState

_NO_NUL = [ProhibitNullCharactersValidator()]

# --------------------------------------------------------------------------- input


class TeamRefField(serializers.CharField):
    """A team by id or slug (CI scripts know slugs; the UI knows ids)."""


class JobSubmitIn(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, validators=_NO_NUL)
    team = TeamRefField(max_length=100, validators=_NO_NUL, help_text="Team id or slug")
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.RESEARCH)
    replicas = serializers.IntegerField(min_value=1, max_value=MAX_REPLICAS, default=1)
    gpus_per_replica = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_REPLICA, default=1)
    gpu_type = serializers.CharField(max_length=32, default="H100", validators=_NO_NUL)
    command = serializers.CharField(max_length=100_000, allow_blank=True, default="", trim_whitespace=False, validators=_NO_NUL)
    env = serializers.DictField(
        child=serializers.CharField(max_length=10_000, allow_blank=True, trim_whitespace=False, validators=_NO_NUL),
        default=dict,
    )
    time_limit_s = serializers.IntegerField(min_value=60, max_value=MAX_TIME_LIMIT_S, required=False, allow_null=True)
    checkpoint_dir = serializers.CharField(max_length=1024, allow_blank=True, default="", validators=_NO_NUL)
    priority = serializers.IntegerField(min_value=-1000, max_value=1000, default=0)


class NotebookSubmitIn(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=200, validators=_NO_NUL)
    team = TeamRefField(max_length=100, validators=_NO_NUL, help_text="Team id or slug")
    tier = serializers.ChoiceField(choices=Tier.choices, default=Tier.RESEARCH)
    gpus = serializers.IntegerField(min_value=1, max_value=MAX_GPUS_PER_REPLICA, default=1)
    gpu_type = serializers.CharField(max_length=32, default="H100", validators=_NO_NUL)
    time_limit_s = serializers.IntegerField(min_value=60, max_value=MAX_TIME_LIMIT_S, required=False, allow_null=True)


class JobListFilterIn(serializers.Serializer[Any]):
    state = serializers.MultipleChoiceField(choices=JobState.choices, required=False, help_text="One or more, comma-separated")
    team = TeamRefField(max_length=100, required=False, validators=_NO_NUL, help_text="Team id or slug")
    user = serializers.CharField(max_length=150, required=False, validators=_NO_NUL, help_text="Username")
    tier = serializers.ChoiceField(choices=Tier.choices, required=False)
    since = serializers.DateTimeField(required=False, help_text="Submitted at or after (ISO 8601)")

    def to_internal_value(self, data: Any) -> Any:
        # ?state=PENDING,RUNNING as well as ?state=PENDING&state=RUNNING
        if hasattr(data, "getlist") and "state" in data:
            data = data.copy()
            states = [s for v in data.getlist("state") for s in v.split(",") if s]
            data.setlist("state", states)
        return super().to_internal_value(data)


class JobLogsIn(serializers.Serializer[Any]):
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


class JobOut(serializers.ModelSerializer[Any]):
    team = TeamRefOut()
    user = serializers.CharField(source="user.username")
    gpus = serializers.IntegerField(source="gpu_count")

    class Meta:
        model = Job
        fields = [
            "id", "name", "kind", "state", "team", "user", "tier", "replicas", "gpus_per_replica", "gpus", "gpu_type",
            "priority", "attempt", "submitted_at", "started_at", "ended_at", "pending_reason", "estimated_start",
            "locality", "borrowed", "exit_code",
        ]  # fmt: skip


class TaskOut(serializers.ModelSerializer[Any]):
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


class JobDetailOut(JobOut):
    tasks = serializers.SerializerMethodField()
    events = EventOut(many=True)
    notebook_url = serializers.SerializerMethodField()

    class Meta(JobOut.Meta):
        fields = [
            *JobOut.Meta.fields,
            "command", "env", "time_limit_s", "checkpoint_dir", "reservation_domain", "leaves_spanned",
            "stop_requested_at", "stop_reason", "last_checkpoint_at", "tasks", "events", "notebook_url",
        ]  # fmt: skip

    def get_tasks(self, job: Job) -> list[dict[str, Any]]:
        tasks = [t for t in job.tasks.all() if t.attempt == job.attempt]
        return TaskOut(tasks, many=True).data  # type: ignore[return-value]

    def get_notebook_url(self, job: Job) -> str | None:
        """Only the notebook's owner gets its URL: it carries the server's token."""
        viewer = self.context.get("viewer")
        if job.kind != JobKind.NOTEBOOK or viewer is None or viewer.pk != job.user_id:
            return None
        return next((t.notebook_url for t in job.tasks.all() if t.attempt == job.attempt and t.notebook_url), None)


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
    used = serializers.IntegerField()
    borrowed = serializers.IntegerField()


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
