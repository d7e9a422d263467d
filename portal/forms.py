"""Forms of the browser portal: they parse and check input; services do the writes."""

from __future__ import annotations

import re
from typing import Any

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import QuerySet

from scheduling import images
from scheduling.models import LEAF_LOCALITY_CHOICES, Node, Tier
from scheduling.services import array_spec_parse
from tenants.models import OrgUnit, Quota, UnitKind

ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def gpu_type_choices() -> list[tuple[str, str]]:
    """GPU types the cluster has or a quota names (a type may be budgeted before its nodes arrive)."""
    types = set(Node.objects.values_list("gpu_type", flat=True).distinct())
    types |= set(Quota.objects.values_list("gpu_type", flat=True).distinct())
    return [(t, t) for t in sorted(types)] or [("H100", "H100")]


def parse_env(text: str) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and # comments skipped) into a dict; errors name the line."""
    env: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not ENV_KEY.match(key):
            raise ValidationError(f"Line {number}: write KEY=VALUE, with a key of letters, digits and _ (got {line!r})")
        env[key] = value
    return env


def format_env(env: dict[str, Any]) -> str:
    return "\n".join(f"{k}={v}" for k, v in env.items())


def clean_image_ref(value: str | None) -> str:
    """An image reference as stored (normalised as Docker does), or "" for none; a clear error otherwise."""
    text = (value or "").strip()
    try:
        return str(images.parse_image(text)) if text else ""
    except images.ImageError as exc:
        raise ValidationError(str(exc)) from None


class _TeamAndGpuTypeForm(forms.Form):
    """A form whose ``team`` is chosen among the user's teams and ``gpu_type`` among the cluster's types."""

    def __init__(self, *args: Any, teams: QuerySet[OrgUnit], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        team_field = self.fields["team"]
        assert isinstance(team_field, forms.ModelChoiceField)
        team_field.queryset = teams
        gpu_field = self.fields["gpu_type"]
        assert isinstance(gpu_field, forms.ChoiceField)
        gpu_field.choices = gpu_type_choices()


class JobForm(_TeamAndGpuTypeForm):
    name = forms.CharField(max_length=200)
    team = forms.ModelChoiceField(queryset=OrgUnit.objects.none(), empty_label=None)
    tier = forms.TypedChoiceField(choices=Tier.choices, coerce=int, initial=Tier.RESEARCH)
    replicas = forms.IntegerField(min_value=1, max_value=512, initial=1)
    gpus_per_replica = forms.IntegerField(min_value=1, max_value=16, initial=1, label="GPUs per replica")
    gpu_type = forms.ChoiceField(label="GPU type")
    command = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), required=False)
    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "KEY=VALUE, one a line"}), required=False, label="Environment"
    )
    time_limit_h = forms.FloatField(
        min_value=1 / 60, max_value=24 * 14, required=False, label="Time limit (hours)", help_text="Empty: the cluster default"
    )
    checkpoint_dir = forms.CharField(
        max_length=1024, required=False, label="Checkpoint directory", help_text="Empty: one is made under your team's directory"
    )
    leaf_locality = forms.ChoiceField(
        choices=LEAF_LOCALITY_CHOICES,
        initial="auto",
        required=False,
        label="One leaf switch",
        help_text="For a gang of several nodes that one leaf switch could hold",
    )
    one_fabric = forms.BooleanField(
        required=False,
        label="One NVLink fabric domain",
        help_text="All its nodes in one multi-node NVLink domain (an NVL72 rack), or wait",
    )
    one_per_node = forms.BooleanField(
        required=False,
        label="One replica per node",
        help_text="Each replica on a node of its own, never two on one node (Slurm's --nodes=N)",
    )
    cpus_per_replica = forms.IntegerField(
        min_value=1, max_value=1024, required=False, label="CPU cores per replica", help_text="Empty: 8 per GPU"
    )
    memory_gb_per_replica = forms.FloatField(
        min_value=1 / 1024,
        max_value=16 * 1024,
        required=False,
        label="Memory per replica (GiB)",
        help_text="Empty: 64 GiB per GPU",
    )
    image = forms.CharField(
        max_length=images.MAX_REF,
        required=False,
        label="Image",
        help_text="A container image to run in, e.g. nvcr.io/nvidia/pytorch:24.05-py3. Empty: on the nodes' own environment",
    )
    container_mounts = forms.CharField(
        max_length=100_000,
        required=False,
        label="Container mounts",
        help_text="Host paths in the container, as pyxis writes them: /data:/data:ro,/scratch",
    )
    container_workdir = forms.CharField(
        max_length=images.MAX_PATH,
        required=False,
        label="Working directory in the container",
        help_text="Empty: the task's run directory",
    )
    array = forms.CharField(
        max_length=1000,
        required=False,
        label="Array",
        help_text="A job array, as sbatch's --array: 0-99, 1,3,5-7 or 0-99:2, and %N for at most N running at once "
        "(0-999%50). One job per index, each with $YARD_ARRAY_TASK_ID. Empty: one job",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The deployment's defaults, said where the fields are left empty.
        per_gpu_cpus = settings.YARD["DEFAULT_CPUS_PER_GPU"]
        per_gpu_gib = int(settings.YARD["DEFAULT_MEMORY_MB_PER_GPU"]) / 1024  # type: ignore[call-overload]
        self.fields["cpus_per_replica"].help_text = f"Empty: {per_gpu_cpus} per GPU"
        self.fields["memory_gb_per_replica"].help_text = f"Empty: {per_gpu_gib:g} GiB per GPU"

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("env") or "")

    def clean_image(self) -> str:
        return clean_image_ref(self.cleaned_data.get("image"))

    def clean_container_mounts(self) -> list[dict[str, Any]]:
        try:
            return images.parse_mounts(self.cleaned_data.get("container_mounts") or "")
        except images.ImageError as exc:
            raise ValidationError(str(exc)) from None

    def clean_container_workdir(self) -> str:
        try:
            return images.check_workdir((self.cleaned_data.get("container_workdir") or "").strip())
        except images.ImageError as exc:
            raise ValidationError(str(exc)) from None

    def clean_array(self) -> str:
        """The array's text, normalised ("" for one job); the service checks it again as it submits."""
        text = (self.cleaned_data.get("array") or "").strip()
        if not text:
            return ""
        try:
            return array_spec_parse(text).text
        except ValidationError as exc:
            raise ValidationError(exc.message_dict["array"]) from None

    def spec_kwargs(self) -> dict[str, Any]:
        """The JobSpec fields (scheduling.services.JobSpec) from the cleaned data."""
        data = self.cleaned_data
        hours = data.get("time_limit_h")
        return {
            "name": data["name"],
            "team": data["team"],
            "tier": data["tier"],
            "kind": "batch",
            "replicas": data["replicas"],
            "gpus_per_replica": data["gpus_per_replica"],
            "gpu_type": data["gpu_type"],
            "command": data.get("command") or "",
            "env": data.get("env") or {},
            "time_limit_s": round(hours * 3600) if hours else None,
            "checkpoint_dir": data.get("checkpoint_dir") or "",
            "leaf_locality": data.get("leaf_locality") or "auto",
            "one_fabric": bool(data.get("one_fabric")),
            "one_per_node": bool(data.get("one_per_node")),
            "cpus_per_replica": data.get("cpus_per_replica"),
            "memory_mb_per_replica": round(gib * 1024) if (gib := data.get("memory_gb_per_replica")) else None,
            "image": data.get("image") or "",
            "container_mounts": data.get("container_mounts") or [],
            "container_workdir": data.get("container_workdir") or "",
        }


def job_initial(job: Any) -> dict[str, Any]:
    """A past job's spec as initial form data, for "copy and edit"."""
    return {
        "name": job.name,
        "team": job.team_id,
        "tier": job.tier,
        "replicas": job.replicas,
        "gpus_per_replica": job.gpus_per_replica,
        "gpu_type": job.gpu_type,
        "command": job.command,
        "env": format_env(job.env or {}),
        "time_limit_h": round(job.time_limit_s / 3600, 3) if job.time_limit_s else None,
        "checkpoint_dir": "",  # a copy gets its own directory unless the user names one
        "leaf_locality": job.leaf_locality,
        "one_fabric": job.one_fabric,
        "one_per_node": job.one_per_node,
        "cpus_per_replica": job.cpus_per_replica,
        "memory_gb_per_replica": round(job.memory_mb_per_replica / 1024, 3),
        "image": job.image,
        "container_mounts": images.mounts_text(job.container_mounts or []),
        "container_workdir": job.container_workdir,
    }


class TemplateNameForm(forms.Form):
    title = forms.CharField(max_length=100, label="Template name")


class NotebookForm(_TeamAndGpuTypeForm):
    team = forms.ModelChoiceField(queryset=OrgUnit.objects.none(), empty_label=None)
    gpu_type = forms.ChoiceField(label="GPU type")
    gpus = forms.IntegerField(min_value=1, max_value=8, initial=1, label="GPUs")
    tier = forms.TypedChoiceField(choices=Tier.choices, coerce=int, initial=Tier.RESEARCH)
    image = forms.CharField(
        max_length=images.MAX_REF,
        required=False,
        label="Image",
        help_text="A container image with Jupyter (`jupyter` on its PATH and a kernel). Empty: the node's own JupyterLab",
    )

    def clean_image(self) -> str:
        return clean_image_ref(self.cleaned_data.get("image"))


class DevSessionForm(_TeamAndGpuTypeForm):
    """A dev session (docs/dev-sessions.md): GPUs on one node, an SSH server, no command; an image if wanted."""

    team = forms.ModelChoiceField(queryset=OrgUnit.objects.none(), empty_label=None)
    gpu_type = forms.ChoiceField(label="GPU type")
    gpus = forms.IntegerField(min_value=1, max_value=8, initial=1, label="GPUs")
    tier = forms.TypedChoiceField(choices=Tier.choices, coerce=int, initial=Tier.RESEARCH)
    time_limit_h = forms.FloatField(
        min_value=1 / 60, max_value=24 * 14, required=False, label="Time limit (hours)", help_text="Empty: the cluster default"
    )
    image = forms.CharField(
        max_length=images.MAX_REF,
        required=False,
        label="Image",
        help_text="A container image with OpenSSH's sshd (openssh-server) to work in. Empty: the node's own environment",
    )

    def clean_image(self) -> str:
        return clean_image_ref(self.cleaned_data.get("image"))


class SshKeyForm(forms.Form):
    public_key = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAA… you@laptop"}),
        label="Public key",
        help_text="The one line of your .pub file, e.g. cat ~/.ssh/id_ed25519.pub (never the private key)",
    )
    name = forms.CharField(max_length=100, required=False, help_text="Empty: the key's comment (you@laptop)")


class QuotaForm(forms.Form):
    guaranteed = forms.IntegerField(min_value=0)
    limit = forms.IntegerField(min_value=0, required=False, help_text="Empty: no limit")
    weight = forms.FloatField(min_value=0.001, initial=1.0)


class UnitCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    kind = forms.ChoiceField(choices=[c for c in UnitKind.choices if c[0] != UnitKind.ROOT])
    parent = forms.ModelChoiceField(queryset=OrgUnit.objects.none(), empty_label=None)

    def __init__(self, *args: Any, parents: QuerySet[OrgUnit], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parent_field = self.fields["parent"]
        assert isinstance(parent_field, forms.ModelChoiceField)
        parent_field.queryset = parents


class UnitMoveForm(forms.Form):
    unit = forms.ModelChoiceField(queryset=OrgUnit.objects.none(), empty_label=None, label="Move")
    parent = forms.ModelChoiceField(queryset=OrgUnit.objects.none(), empty_label=None, label="Under")

    def __init__(self, *args: Any, movable: QuerySet[OrgUnit], parents: QuerySet[OrgUnit], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        unit_field, parent_field = self.fields["unit"], self.fields["parent"]
        assert isinstance(unit_field, forms.ModelChoiceField) and isinstance(parent_field, forms.ModelChoiceField)
        unit_field.queryset, parent_field.queryset = movable, parents


# --------------------------------------------------------------------------- inference services


def _check_probe_path(value: str, *, required: bool) -> str:
    path = (value or "").strip()
    if not path and not required:
        return ""
    if not path.startswith("/") or any(c in path for c in " \x00\r\n\t"):
        raise ValidationError("A path on the server, starting with /, e.g. /health")
    return path


class _ReleaseFields(forms.Form):
    """What a revision runs: an image, a command, an environment (a new value of any is a new revision)."""

    image = forms.CharField(
        max_length=images.MAX_REF,
        required=False,
        label="Image",
        help_text="A container image to serve from, e.g. vllm/vllm-openai:v0.6.3. Empty: the nodes' own environment",
    )
    command = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "python -m http.server $PORT"}),
        required=False,
        help_text="Listen on $PORT unless a port is set. Empty: the image's own entry point",
    )
    env = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "KEY=VALUE, one a line"}), required=False, label="Environment"
    )

    def clean_env(self) -> dict[str, str]:
        return parse_env(self.cleaned_data.get("env") or "")

    def clean_image(self) -> str:
        return clean_image_ref(self.cleaned_data.get("image"))

    def clean_command(self) -> str:
        return (self.cleaned_data.get("command") or "").replace("\r\n", "\n").strip()


class ServiceForm(_ReleaseFields, _TeamAndGpuTypeForm):
    """A new service (scheduling.serving.services.ServiceSpec); the service checks what only it can."""

    team = forms.ModelChoiceField(queryset=OrgUnit.objects.none(), empty_label=None)
    name = forms.CharField(
        max_length=63, help_text="Lowercase letters, digits and dashes: part of its URL, /services/<team>/<name>/"
    )
    tier = forms.TypedChoiceField(
        choices=Tier.choices, coerce=int, initial=Tier.PRODUCTION, help_text="1: never preempted; 2 or 3 for staging"
    )
    gpu_type = forms.ChoiceField(label="GPU type")
    gpus_per_node = forms.IntegerField(min_value=1, max_value=16, initial=1, label="GPUs per node")
    nodes_per_replica = forms.IntegerField(
        min_value=1, max_value=64, initial=1, help_text="More than 1: one server over several nodes (rank 0 serves HTTP)"
    )
    replicas = forms.IntegerField(min_value=1, max_value=64, initial=1)
    min_replicas = forms.IntegerField(min_value=1, max_value=64, required=False, help_text="Empty: as many as replicas")
    max_replicas = forms.IntegerField(
        min_value=1, max_value=64, required=False, help_text="Above the minimum: scaled by the requests in flight"
    )
    target_inflight = forms.FloatField(
        min_value=0.1, max_value=10_000, initial=4.0, label="Target in-flight requests", help_text="Per replica, when autoscaled"
    )
    port = forms.IntegerField(min_value=1024, max_value=65535, required=False, help_text="Empty: the server listens on $PORT")
    readiness_path = forms.CharField(max_length=512, initial="/", help_text="Ready once it answers 200-399, e.g. /health")
    liveness_path = forms.CharField(
        max_length=512, required=False, help_text="Restarted after 3 failed probes in a row. Empty: no liveness probe"
    )
    progress_deadline_s = forms.IntegerField(
        min_value=30,
        max_value=86_400,
        initial=600,
        label="Progress deadline (s)",
        help_text="A rollout not ready by then is rolled back",
    )

    field_order = [
        "team", "name", "tier", "gpu_type", "gpus_per_node", "nodes_per_replica", "replicas", "min_replicas",
        "max_replicas", "target_inflight", "image", "command", "env", "port", "readiness_path", "liveness_path",
        "progress_deadline_s",
    ]  # fmt: skip

    def clean_name(self) -> str:
        return (self.cleaned_data.get("name") or "").strip()

    def clean_readiness_path(self) -> str:
        return _check_probe_path(self.cleaned_data.get("readiness_path") or "", required=True)

    def clean_liveness_path(self) -> str:
        return _check_probe_path(self.cleaned_data.get("liveness_path") or "", required=False)

    def spec_kwargs(self) -> dict[str, Any]:
        """The ServiceSpec fields (scheduling.serving.services.ServiceSpec) from the cleaned data."""
        data = self.cleaned_data
        return {
            "name": data["name"],
            "team": data["team"],
            "tier": data["tier"],
            "gpu_type": data["gpu_type"],
            "gpus_per_node": data["gpus_per_node"],
            "nodes_per_replica": data["nodes_per_replica"],
            "replicas": data["replicas"],
            "min_replicas": data.get("min_replicas"),
            "max_replicas": data.get("max_replicas"),
            "target_inflight": data["target_inflight"],
            "image": data.get("image") or "",
            "command": data.get("command") or "",
            "env": data.get("env") or {},
            "port": data.get("port"),
            "readiness_path": data["readiness_path"],
            "liveness_path": data.get("liveness_path") or "",
            "progress_deadline_s": data["progress_deadline_s"],
        }


class ServiceScaleForm(forms.Form):
    replicas = forms.IntegerField(min_value=1, max_value=64, label="Replicas")


class ServiceRolloutForm(_ReleaseFields):
    """A new release of a service, rolled out replica by replica."""


class ServiceRollbackForm(forms.Form):
    to_revision = forms.TypedChoiceField(coerce=int, label="Revision", choices=())

    def __init__(self, *args: Any, revisions: list[tuple[int, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = self.fields["to_revision"]
        assert isinstance(field, forms.TypedChoiceField)
        field.choices = revisions


class ServiceTokenForm(forms.Form):
    name = forms.CharField(max_length=100, label="Token name", help_text="Who calls with it, e.g. checkout-frontend")
