"""Job files, translated on the server into the job-submit input (the fields of ``JobSubmitIn``).

Three formats, so a CI pipeline can post what it already has (docs/job-files.md):

- a Yardmaster job file (YAML or JSON): the API's own fields, nothing else;
- a Kubeflow ``kubeflow.org/v1`` PyTorchJob or MPIJob manifest, or a ``kubeflow.org/v2beta1`` MPIJob
  (the mpi-operator's current API);
- a Slurm batch script with ``#SBATCH`` directives.

The rule for everything a file can say: it is honoured (mapped onto a job field, or kept by the
command the job runs), or it is accepted with a warning naming it because ignoring it does not
change what the job computes, or it is refused with a 400 naming it and saying what to change.
Nothing is dropped silently. The translation is plain Python over the parsed file (no database):
the caller passes the GPU types the cluster has, and validates the result with the API's serializer.
"""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from django.core.exceptions import ValidationError

FORMATS = ("yardmaster", "pytorchjob", "mpijob", "slurm")
YAML_MEDIA_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
SCRIPT_MEDIA_TYPES = ("text/x-shellscript", "application/x-sh", "text/x-sh")
MAX_FILE_BYTES = 1024 * 1024

# The API's own input fields (JobSubmitIn): a Yardmaster job file may hold these and nothing else.
JOB_FIELDS = (
    "name", "team", "tier", "replicas", "gpus_per_replica", "gpu_type", "command", "env",
    "time_limit_s", "checkpoint_dir", "priority", "leaf_locality", "one_fabric", "one_per_node",
)  # fmt: skip
YARDMASTER_API_VERSION = "yardmaster.io/v1"
KUBEFLOW_API_VERSION = "kubeflow.org/v1"
MPI_V2_API_VERSION = "kubeflow.org/v2beta1"  # the mpi-operator's MPIJob since v0.3: the same fields as v1's here
# Kubernetes' Job default for backoffLimit: the restarts a rank with restartPolicy OnFailure gets when
# runPolicy.backoffLimit is not given (the training operator itself sets no bound).
DEFAULT_BACKOFF_LIMIT = 6
LABEL_PREFIX = "yardmaster.io/"
TIER_WORDS = {
    "1": 1, "production": 1, "prod": 1, "high": 1,
    "2": 2, "research": 2, "normal": 2, "standard": 2,
    "3": 3, "spot": 3, "low": 3, "scavenger": 3, "preemptible": 3,
}  # fmt: skip


@dataclass
class Translation:
    """What a job file asks for, as the API's job fields, with the warnings to show the submitter.

    ``origin`` maps a job field to the place in the file it came from, so a field the API's own
    validation refuses is reported where the user wrote it (``#SBATCH --gpus-per-node=32``).
    """

    source: str
    fields: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)
    on_failure: bool = False  # a Kubeflow restartPolicy OnFailure is honoured (runPolicy.backoffLimit counts its restarts)

    def set(self, name: str, value: Any, origin: str) -> None:
        self.fields[name] = value
        self.origin[name] = origin


class _Errors:
    """Errors keyed by where they are in the file; raised all at once, as the API does for fields."""

    def __init__(self) -> None:
        self.by_place: dict[str, list[str]] = {}

    def add(self, place: str, message: str) -> None:
        self.by_place.setdefault(place, []).append(message)

    def raise_any(self) -> None:
        if self.by_place:
            raise ValidationError(self.by_place)


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a job file has no use for them, and a few bytes of nested
    aliases stand for billions of nodes once something walks the document."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in job files", event.start_mark)
        return super().compose_node(parent, index)


def _refuse(place: str, message: str) -> ValidationError:
    return ValidationError({place: [message]})


# =========================================================================== entry points


def detect_format(data: Any) -> str:
    """The format of a parsed YAML/JSON document: a Kubeflow manifest by its apiVersion and kind, else ours."""
    if not isinstance(data, Mapping):
        raise _refuse("file", "A job file is a mapping of fields (YAML or JSON), not a list or a single value")
    api_version, kind = data.get("apiVersion"), data.get("kind")
    if isinstance(api_version, str) and api_version.startswith("kubeflow.org/"):
        if api_version == MPI_V2_API_VERSION and kind == "MPIJob":
            return "mpijob"
        if api_version != KUBEFLOW_API_VERSION:
            raise _refuse(
                "apiVersion",
                f"{api_version} is not supported: Yardmaster reads {KUBEFLOW_API_VERSION} manifests and "
                f"{MPI_V2_API_VERSION} MPIJobs",
            )
        if kind == "PyTorchJob":
            return "pytorchjob"
        if kind == "MPIJob":
            return "mpijob"
        raise _refuse("kind", f"{kind!r} is not supported: Yardmaster reads {KUBEFLOW_API_VERSION} PyTorchJob and MPIJob")
    if api_version is not None and api_version != YARDMASTER_API_VERSION:
        raise _refuse(
            "apiVersion",
            f"{str(api_version)[:80]!r} is not a format Yardmaster reads: use {YARDMASTER_API_VERSION} (a Yardmaster "
            f"job file), {KUBEFLOW_API_VERSION} PyTorchJob or MPIJob, or send a Slurm batch script as text/x-shellscript",
        )
    return "yardmaster"


def parse_yaml(text: str) -> Any:
    """One YAML (or JSON) document, safely: no tags, no anchors or aliases (a few bytes of aliases can
    stand for billions of nodes), at most MAX_FILE_BYTES."""
    if len(text.encode("utf-8", errors="replace")) > MAX_FILE_BYTES:
        raise _refuse("file", f"A job file is at most {MAX_FILE_BYTES // 1024} KiB")
    try:
        documents = [d for d in yaml.load_all(text, Loader=_NoAliasLoader) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise _refuse("file", f"Not valid YAML{where}: {exc.problem or exc}") from None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise _refuse("file", f"Not valid YAML: {str(exc)[:200]}") from None
    if len(documents) != 1:
        raise _refuse("file", f"Send one job per file: this one has {len(documents)} YAML documents")
    return documents[0]


def translate(*, fmt: str, data: Any = None, text: str = "", gpu_types: Sequence[str] = ()) -> Translation:
    """The job fields a file asks for. ``data`` is the parsed document (YAML/JSON formats), ``text`` the
    script (Slurm). ``gpu_types`` are the GPU types the cluster has (Slurm partitions name them).

    Raises ValidationError keyed by the place in the file, with what to change.
    """
    if fmt == "slurm":
        return translate_slurm(text, gpu_types=gpu_types)
    if data is None:
        data = parse_yaml(text)
    detected = detect_format(data)
    if fmt not in ("auto", detected):
        raise _refuse("format", f"format is {fmt!r} but the file is a {detected} file")
    if detected == "yardmaster":
        return translate_yardmaster(data)
    return translate_kubeflow(data, kind="PyTorchJob" if detected == "pytorchjob" else "MPIJob")


# =========================================================================== Yardmaster job files


def translate_yardmaster(data: Mapping[str, Any]) -> Translation:
    """The API's own fields; an unknown key is refused (a typo must not fall back to a default silently)."""
    out = Translation(source="yardmaster")
    errors = _Errors()
    if data.get("kind", "Job") != "Job":
        errors.add("kind", f"A Yardmaster job file has kind: Job (or none), not {str(data.get('kind'))[:40]!r}")
    for key, value in data.items():
        if key in ("apiVersion", "kind"):
            continue
        if key not in JOB_FIELDS:
            close = difflib.get_close_matches(str(key).replace("-", "_"), JOB_FIELDS, n=1)
            hint = f"; did you mean {close[0]}?" if close else f"; the fields are {', '.join(JOB_FIELDS)}"
            errors.add(str(key)[:60], f"Unknown field{hint}")
            continue
        out.set(key, value, key)
    errors.raise_any()
    return out


# =========================================================================== Kubeflow PyTorchJob and MPIJob

# What each level of a manifest may hold: honoured by the translation, accepted because its meaning is
# kept, accepted with a warning (ignoring it does not change what the job computes), or refused.
_OK = "ok"
_WARN = "warn"

_TOP_KEYS = {"apiVersion": _OK, "kind": _OK, "metadata": _OK, "spec": _OK, "status": _OK}
_METADATA_KEYS = {
    "name": _OK, "generateName": _OK, "labels": _OK, "annotations": _OK,
    "namespace": "Yardmaster has no namespaces: the team comes from the yardmaster.io/team label or annotation",
    # what `kubectl get -o yaml` adds: the cluster's bookkeeping, not the job's
    "uid": _OK, "resourceVersion": _OK, "creationTimestamp": _OK, "generation": _OK, "managedFields": _OK,
    "selfLink": _OK, "finalizers": _OK, "ownerReferences": _OK,
}  # fmt: skip
_RUN_POLICY_KEYS = {
    "cleanPodPolicy": _OK,  # a job's processes always end with it: nothing is left to clean
    "ttlSecondsAfterFinished": "a finished job stays in Yardmaster's history (its record is not deleted)",
    "activeDeadlineSeconds": _OK,  # -> time_limit_s
    "backoffLimit": _OK,  # the restarts of a rank with restartPolicy OnFailure; else only 0
    "schedulingPolicy": _OK,
    "suspend": _OK,  # checked: only false
    "managedBy": "Yardmaster runs the job itself",
}  # fmt: skip
_SCHEDULING_POLICY_KEYS = {
    "minAvailable": _OK,  # checked: the whole gang (Yardmaster is all or nothing)
    "queue": _OK,  # -> team, when no yardmaster.io/team is given
    "minResources": "Yardmaster admits a gang by its GPUs",
    "scheduleTimeoutSeconds": None,
    "priorityClass": None,
}
_REPLICA_KEYS = {"replicas": _OK, "template": _OK, "restartPolicy": _OK}
_POD_SPEC_KEYS = {
    "containers": _OK,
    "restartPolicy": _OK,
    "tolerations": "Yardmaster's nodes have no taints to tolerate",
    "schedulerName": "Yardmaster is the gang scheduler",
    "serviceAccountName": "there is no Kubernetes service account on Yardmaster's nodes",
    "serviceAccount": "there is no Kubernetes service account on Yardmaster's nodes",
    "automountServiceAccountToken": "there is no Kubernetes service account on Yardmaster's nodes",
    "imagePullSecrets": "the image is recorded on the job, not pulled",
    "dnsPolicy": "the job uses its node's DNS",
    "hostNetwork": "a job's processes always use their node's network",
    "hostIPC": "a job's processes always share their node's IPC namespace",
    "securityContext": "the job runs as its owner's account (or the agent's)",
    "terminationGracePeriodSeconds": "the grace period between SIGTERM and SIGKILL is the cluster's (YARD_GRACE_PERIOD_S)",
    "enableServiceLinks": "there are no Kubernetes services",
    "shareProcessNamespace": "each rank is one process tree",
}  # fmt: skip
_POD_SPEC_REFUSED = {
    "volumes": "volumes cannot be mounted: jobs run on their nodes' file systems; remove volumes and volumeMounts "
    "and read data from the shared file system (the checkpoint directory is YARD_CHECKPOINT_DIR)",
    "initContainers": "init containers cannot be run: do that work at the start of the command",
    "nodeSelector": "placement is Yardmaster's (topology-aware); choose the GPU type with the yardmaster.io/gpu-type label",
    "affinity": "placement is Yardmaster's (topology-aware); choose the GPU type with the yardmaster.io/gpu-type label",
    "nodeName": "placement is Yardmaster's (topology-aware): a job cannot pin a node",
    "priorityClassName": "the tier sets priority here: use the yardmaster.io/tier label (1 production, 2 research, 3 spot)",
    "priority": "the tier sets priority here: use the yardmaster.io/tier label (1 production, 2 research, 3 spot)",
    "topologySpreadConstraints": "placement is Yardmaster's: it packs a gang into the fewest leaf switches",
    "runtimeClassName": "jobs run as processes on their nodes, not in a container runtime",
}
_CONTAINER_KEYS = {
    "name": _OK, "image": _OK, "command": _OK, "args": _OK, "env": _OK, "workingDir": _OK, "resources": _OK,
    "terminationMessagePath": _OK, "terminationMessagePolicy": _OK, "stdin": _OK, "stdinOnce": _OK, "tty": _OK,
    "imagePullPolicy": "the image is recorded on the job, not pulled",
    "ports": "Yardmaster picks each job's rendezvous port (MASTER_PORT) on its rank-0 node",
    "securityContext": "the job runs as its owner's account (or the agent's)",
    "livenessProbe": "a rank is watched as a process: it runs until it exits",
    "readinessProbe": "a rank is watched as a process: it runs until it exits",
    "startupProbe": "a rank is watched as a process: it runs until it exits",
}  # fmt: skip
_CONTAINER_REFUSED = {
    "envFrom": "ConfigMaps and Secrets do not exist here: give each variable in env with its value",
    "volumeMounts": "volumes cannot be mounted: jobs run on their nodes' file systems",
    "volumeDevices": "volumes cannot be mounted: jobs run on their nodes' file systems",
    "lifecycle": "postStart and preStop hooks cannot be run: a preempted rank gets SIGTERM, then SIGKILL after the grace",
}
_RESOURCE_WARN = {
    "ephemeral-storage": "a rank uses its node's disk",
}
# Kubernetes quantities: cores (8, 7.5, 500m) and bytes (64Gi, 512Mi, 1G, 1e9), as Yardmaster's cores and MiB.
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?(?:[eE]\d+)?)(m|Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?")
_BYTES = {None: 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5}  # fmt: skip


def _quantity(where: str, amount: Any, *, memory: bool, errors: _Errors) -> int | None:
    """A pod's cpu (whole cores, rounded up) or memory (MiB, rounded up) request or limit."""
    match = _QUANTITY.fullmatch(str(amount).strip())
    unit = match.group(2) if match else None
    if match is None or (unit == "m" if memory else unit not in (None, "m")):
        errors.add(where, "is not a Kubernetes quantity (e.g. cpu: 8 or 500m; memory: 64Gi)")
        return None
    number = float(match.group(1))
    if memory:
        return max(1, math.ceil(number * _BYTES[unit] / 1024**2))
    return max(1, math.ceil(number / 1000 if unit == "m" else number))


_GPU_RESOURCE = "nvidia.com/gpu"
# Set by the Kubeflow training operator in every pod, and by Yardmaster's agent (or the command) for every rank.
_OPERATOR_ENV = (
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
    "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE",
    "YARD_JOB_ID", "YARD_ATTEMPT", "YARD_NUM_GPUS", "YARD_CHECKPOINT_DIR", "YARD_WORKDIR", "YARD_IMAGE",
)  # fmt: skip
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class _Rank:
    """One replica type (Master, Worker, Launcher) as far as Yardmaster can run it."""

    role: str
    replicas: int
    gpus: int
    image: str | None
    command: list[str] | None
    args: list[str]
    env: dict[str, str]
    working_dir: str | None
    place: str
    restart: str | None = None  # restartPolicy (the replica spec's, else its pod's)


def _check_keys(
    where: str, value: Any, allowed: Mapping[str, Any], refused: Mapping[str, str], out: Translation, errors: _Errors
) -> dict[str, Any]:
    """The mapping at ``where`` with its keys sorted into honoured, warned about and refused."""
    if not isinstance(value, Mapping):
        errors.add(where, "must be a mapping")
        return {}
    for key in value:
        place = f"{where}.{key}"
        if key in refused:
            errors.add(place, f"cannot be honoured: {refused[key]}")
        elif key not in allowed:
            errors.add(place, "is not a field Yardmaster knows here: remove it (nothing is ignored silently)")
        elif allowed[key] is None:
            errors.add(place, "cannot be honoured by Yardmaster: remove it")
        elif allowed[key] != _OK:
            out.warnings.append(f"{place} is ignored: {allowed[key]}")
    return dict(value)


def _int_value(place: str, value: Any, errors: _Errors, *, minimum: int = 0) -> int | None:
    if isinstance(value, bool):
        errors.add(place, "must be a whole number")
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or value < minimum:
        errors.add(place, f"must be a whole number of at least {minimum}")
        return None
    return value


def _string_list(place: str, value: Any, errors: _Errors) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
        errors.add(place, "must be a list of strings")
        return None
    return [str(v) for v in value]


def _labels(meta: Mapping[str, Any], out: Translation, errors: _Errors) -> dict[str, tuple[str, str]]:
    """yardmaster.io/ keys from the annotations and the labels (an annotation and a label that disagree: an error)."""
    found: dict[str, tuple[str, str]] = {}
    for kind in ("annotations", "labels"):
        values = meta.get(kind) or {}
        if not isinstance(values, Mapping):
            errors.add(f"metadata.{kind}", "must be a mapping")
            continue
        for key, value in values.items():
            if not isinstance(key, str) or not key.startswith(LABEL_PREFIX):
                continue  # another system's metadata: Kubernetes itself gives it no meaning for the job
            name = key.removeprefix(LABEL_PREFIX)
            place = f"metadata.{kind}.{key}"
            if name not in ("team", "tier", "gpu-type", "priority"):
                errors.add(place, "unknown: Yardmaster reads yardmaster.io/team, tier, gpu-type and priority")
                continue
            text = str(value).strip()
            if name in found and found[name][0] != text:
                errors.add(place, f"says {text!r} but {found[name][1]} says {found[name][0]!r}")
                continue
            found.setdefault(name, (text, place))
    return found


def _apply_labels(labels: Mapping[str, tuple[str, str]], out: Translation, errors: _Errors) -> None:
    if "team" in labels:
        out.set("team", labels["team"][0], labels["team"][1])
    if "tier" in labels:
        text, place = labels["tier"]
        tier = TIER_WORDS.get(text.lower())
        if tier is None:
            errors.add(place, f"{text!r} is not a tier: 1 (production), 2 (research) or 3 (spot)")
        else:
            out.set("tier", tier, place)
    if "gpu-type" in labels:
        out.set("gpu_type", labels["gpu-type"][0], labels["gpu-type"][1])
    if "priority" in labels:
        text, place = labels["priority"]
        try:
            out.set("priority", int(text), place)
        except ValueError:
            errors.add(place, f"{text!r} is not a whole number (-1000 to 1000)")


def _read_rank(role: str, place: str, spec: Any, out: Translation, errors: _Errors) -> _Rank | None:
    spec = _check_keys(place, spec, _REPLICA_KEYS, {}, out, errors)
    if not spec:
        return None
    replicas = _int_value(f"{place}.replicas", spec.get("replicas", 1), errors)
    _check_restart(f"{place}.restartPolicy", spec.get("restartPolicy"), errors)
    template = _check_keys(f"{place}.template", spec.get("template", {}), {"metadata": _OK, "spec": _OK}, {}, out, errors)
    pod_place = f"{place}.template.spec"
    pod = _check_keys(pod_place, template.get("spec", {}), _POD_SPEC_KEYS, _POD_SPEC_REFUSED, out, errors)
    _check_restart(f"{pod_place}.restartPolicy", pod.get("restartPolicy"), errors)
    containers = pod.get("containers")
    if not isinstance(containers, list) or not containers:
        errors.add(f"{pod_place}.containers", "give one container: its command is what every rank runs")
        return None
    if len(containers) > 1:
        names = ", ".join(str(c.get("name", i)) for i, c in enumerate(containers) if isinstance(c, Mapping))
        errors.add(
            f"{pod_place}.containers[1]",
            f"cannot be honoured: a rank is one process tree, so one container per replica ({names}); "
            "start helpers from the main command",
        )
    c_place = f"{pod_place}.containers[0]"
    container = _check_keys(c_place, containers[0], _CONTAINER_KEYS, _CONTAINER_REFUSED, out, errors)
    image = container.get("image")
    if image is not None and not isinstance(image, str):
        errors.add(f"{c_place}.image", "must be a string")
        image = None
    command = _string_list(f"{c_place}.command", container.get("command"), errors)
    args = _string_list(f"{c_place}.args", container.get("args"), errors) or []
    env = _read_env(f"{c_place}.env", container.get("env"), errors)
    working_dir = container.get("workingDir")
    if working_dir is not None and not isinstance(working_dir, str):
        errors.add(f"{c_place}.workingDir", "must be a string")
        working_dir = None
    # An MPIJob's launcher is not a replica here (Yardmaster runs no launcher pod): its cores and memory size nothing.
    gpus = _read_resources(f"{c_place}.resources", container.get("resources"), out, errors, sizes=role != "Launcher")
    if replicas is None:
        return None
    restart = spec.get("restartPolicy") or pod.get("restartPolicy")
    return _Rank(role, replicas, gpus, image, command, args, env, working_dir, c_place, restart)


def _check_restart(place: str, policy: Any, errors: _Errors) -> None:
    # ExitCode: only retryable (signal) exits restart -- what Yardmaster's requeue after preemption does.
    # OnFailure: the rank's command is restarted in place, as the kubelet restarts a failed container,
    # up to runPolicy.backoffLimit times (_retried).
    if policy in (None, "Never", "ExitCode", "OnFailure"):
        return
    errors.add(
        place,
        f"{policy} cannot be honoured: a rank that exits 0 is done here, it is not started again. Use restartPolicy: "
        "OnFailure (restart a failed rank), Never or ExitCode",
    )


def _read_env(place: str, value: Any, errors: _Errors) -> dict[str, str]:
    env: dict[str, str] = {}
    if value is None:
        return env
    if not isinstance(value, list):
        errors.add(place, "must be a list of {name, value}")
        return env
    for i, item in enumerate(value):
        where = f"{place}[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            errors.add(where, "must be {name: ..., value: ...}")
            continue
        if "valueFrom" in item:
            errors.add(
                f"{where}.valueFrom",
                f"cannot be honoured for {item['name']}: Secrets, ConfigMaps and the downward API do not exist here; "
                "give the value",
            )
            continue
        extra = set(item) - {"name", "value"}
        if extra:
            errors.add(where, f"unknown keys {', '.join(sorted(map(str, extra)))}")
        raw = item.get("value", "")
        if isinstance(raw, Mapping | list) or (raw is None and "value" in item):
            errors.add(f"{where}.value", "must be a string")
            continue
        env[item["name"]] = str(raw).lower() if isinstance(raw, bool) else str(raw)
    return env


def _read_resources(place: str, value: Any, out: Translation, errors: _Errors, *, sizes: bool = True) -> int:
    if value is None:
        return 0
    if not isinstance(value, Mapping):
        errors.add(place, "must be a mapping of limits and requests")
        return 0
    gpus: dict[str, int] = {}
    for kind in value:
        if kind not in ("limits", "requests"):
            errors.add(f"{place}.{kind}", "is not a field Yardmaster knows here: remove it")
            continue
        amounts = value[kind]
        if not isinstance(amounts, Mapping):
            errors.add(f"{place}.{kind}", "must be a mapping")
            continue
        for resource, amount in amounts.items():
            where = f"{place}.{kind}.{resource}"
            if resource == _GPU_RESOURCE:
                n = _int_value(where, amount, errors)
                if n is not None:
                    gpus[kind] = n
            elif resource in ("cpu", "memory") and not sizes:
                out.warnings.append(f"{where} is ignored: Yardmaster runs no launcher pod; mpirun's work runs on the workers")
            elif resource in ("cpu", "memory"):
                # A replica gets what its largest pod asks (requests, as Kubernetes schedules on them;
                # else limits): one replica is one pod here.
                n = _quantity(where, amount, memory=resource == "memory", errors=errors)
                field = "cpus_per_replica" if resource == "cpu" else "memory_mb_per_replica"
                if (
                    n is not None
                    and (kind == "requests" or f"{field}@requests" not in out.origin)
                    and n > out.fields.get(field, 0)
                ):
                    out.set(field, n, where)
                    if kind == "requests":
                        out.origin[f"{field}@requests"] = where
            elif resource in _RESOURCE_WARN:
                out.warnings.append(f"{where} is ignored: {_RESOURCE_WARN[resource]}")
            else:
                errors.add(where, f"cannot be honoured: Yardmaster allocates whole {_GPU_RESOURCE} GPUs only")
    if "limits" in gpus and "requests" in gpus and gpus["limits"] != gpus["requests"]:
        errors.add(f"{place}.requests.{_GPU_RESOURCE}", "must equal the limit (as Kubernetes requires for GPUs)")
    return gpus.get("limits", gpus.get("requests", 0))


_K8S_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def _shell_word(arg: str, defined: set[str]) -> str:
    """One container argument as a shell word, with Kubernetes' $(VAR) references kept as references.

    Kubernetes expands $(VAR) in command and args from the container's variables (and leaves a
    reference to an undefined one as it is); $$ stands for $. The shell must see "${VAR}" for the
    first, and everything else quoted, so nothing else in the argument is expanded.
    """
    pieces: list[str] = []
    literal = ""
    position = 0
    for match in _K8S_REF.finditer(arg):
        literal += arg[position : match.start()]
        position = match.end()
        name = match.group(1)
        if name is None:
            literal += "$"
        elif name in defined:
            if literal:
                pieces.append(shlex.quote(literal))
                literal = ""
            pieces.append(f'"${{{name}}}"')
        else:
            literal += match.group(0)
    literal += arg[position:]
    if literal or not pieces:
        pieces.append(shlex.quote(literal))
    return "".join(pieces)


def _command_line(words: Sequence[str], defined: set[str]) -> str:
    return " ".join(_shell_word(w, defined) for w in words)


def translate_kubeflow(data: Mapping[str, Any], *, kind: str) -> Translation:
    out = Translation(source=kind.lower())
    errors = _Errors()
    _check_keys("manifest", data, _TOP_KEYS, {}, out, errors)
    meta = _check_keys("metadata", data.get("metadata") or {}, _METADATA_KEYS, {}, out, errors)
    name = meta.get("name") or meta.get("generateName")
    if isinstance(name, str) and name.strip():
        out.set("name", name.strip().rstrip("-"), "metadata.name")
    labels = _labels(meta, out, errors)
    _apply_labels(labels, out, errors)
    spec = data.get("spec")
    if not isinstance(spec, Mapping):
        errors.add("spec", "a manifest needs a spec")
        errors.raise_any()
        return out
    policy = spec.get("runPolicy")
    backoff = policy.get("backoffLimit") if isinstance(policy, Mapping) else None
    restarts = backoff if isinstance(backoff, int) and not isinstance(backoff, bool) and backoff >= 0 else None
    if kind == "PyTorchJob":
        _pytorchjob(spec, out, errors, restarts=restarts)
    else:
        _mpijob(spec, out, errors, restarts=restarts)
    _run_policy(policy, out, errors, labels=labels)
    errors.raise_any()
    return out


def _same(ranks: Sequence[_Rank], attribute: str, what: str, errors: _Errors) -> None:
    first = ranks[0]
    for other in ranks[1:]:
        if getattr(other, attribute) != getattr(first, attribute):
            errors.add(
                f"{other.place}.{what}",
                f"differs from {first.role}'s: every rank of a Yardmaster job runs the same {what} "
                f"({first.role}: {getattr(first, attribute)!r}, {other.role}: {getattr(other, attribute)!r})",
            )


def _record_image(image: str | None, env: dict[str, str], out: Translation, place: str) -> None:
    if image:
        env["YARD_IMAGE"] = image
        out.origin.setdefault("env", place)
        out.warnings.append(
            f"{place}.image {image!r} is recorded on the job (YARD_IMAGE); the command runs in its nodes' "
            "environment, so that image's software must be installed there"
        )


def _pytorchjob(spec: Mapping[str, Any], out: Translation, errors: _Errors, *, restarts: int | None) -> None:
    for key in spec:
        place = f"spec.{key}"
        if key == "elasticPolicy":
            errors.add(place, "cannot be honoured: a Yardmaster gang has a fixed size; give fixed replicas, remove elasticPolicy")
        elif key not in ("pytorchReplicaSpecs", "runPolicy", "nprocPerNode"):
            errors.add(place, "is not a field Yardmaster knows here: remove it")
    replica_specs = spec.get("pytorchReplicaSpecs")
    if not isinstance(replica_specs, Mapping) or not replica_specs:
        errors.add("spec.pytorchReplicaSpecs", "give Master and/or Worker replica specs")
        return
    ranks: list[_Rank] = []
    for role, replica in replica_specs.items():
        place = f"spec.pytorchReplicaSpecs.{role}"
        if role not in ("Master", "Worker"):
            errors.add(place, "is not a PyTorchJob replica type: Master and Worker")
            continue
        rank = _read_rank(role, place, replica, out, errors)
        if rank is not None:
            ranks.append(rank)
    if not ranks:
        return
    ranks.sort(key=lambda r: r.role != "Master")  # the Master is rank 0, as the operator makes it
    master = next((r for r in ranks if r.role == "Master"), None)
    if master is not None and master.replicas != 1:
        errors.add(f"{master.place.split('.template')[0]}.replicas", "a PyTorchJob has exactly one Master")
    live = [r for r in ranks if r.replicas > 0]
    if not live:
        errors.add("spec.pytorchReplicaSpecs", "at least one replica")
        return
    for attribute, what in (("gpus", f"resources.limits.{_GPU_RESOURCE}"), ("image", "image"), ("command", "command"),
                            ("args", "args"), ("env", "env"), ("working_dir", "workingDir"),
                            ("restart", "restartPolicy")):  # fmt: skip
        _same(live, attribute, what, errors)
    first = live[0]
    total = sum(r.replicas for r in live)
    out.set("replicas", total, "spec.pytorchReplicaSpecs (Master + Worker replicas)")
    _gpus(first, out, errors)
    env = dict(first.env)
    exports = {"PET_NNODES": str(total)}
    nproc = spec.get("nprocPerNode")
    if nproc is not None:
        if str(nproc) == "auto" or str(nproc) == "gpu":
            exports["PET_NPROC_PER_NODE"] = str(first.gpus)
        elif str(nproc).isdigit():
            exports["PET_NPROC_PER_NODE"] = str(nproc)
        else:
            errors.add("spec.nprocPerNode", "a whole number, auto or gpu")
    _record_image(first.image, env, out, first.place)
    out.set("env", env, f"{first.place}.env")
    tries = _restarts(first, restarts, out)
    out.set("command", _container_command(first, env, exports, errors, restarts=tries), f"{first.place}.command")


def _restarts(rank: _Rank, backoff: int | None, out: Translation) -> int:
    """How often a failed rank's command is started again: restartPolicy OnFailure, up to backoffLimit."""
    if rank.restart != "OnFailure":
        return 0
    limit = DEFAULT_BACKOFF_LIMIT if backoff is None else backoff
    out.on_failure = True
    origin = "spec.runPolicy.backoffLimit" if backoff is not None else "Kubernetes' default backoffLimit"
    out.warnings.append(
        f"restartPolicy OnFailure: a rank whose command fails is started again on its node, up to {limit} times "
        f"({origin}), after a back-off of 10 s doubling to 5 min, as the kubelet restarts a failed container; the "
        "other ranks keep running. When the restarts are spent, the job fails"
    )
    return limit


# The restart loop of restartPolicy OnFailure: the kubelet's crash-loop back-off (10 s, doubling, at most
# 5 min); a rank stopped by Yardmaster (SIGTERM 143, SIGKILL 137: preempted, cancelled, out of time) is not
# started again.
_RESTART_LOOP = """restarts=0
while :; do
  __COMMAND__
  rc=$?
  [ "$rc" -eq 0 ] && exit 0
  case "$rc" in 137|143) exit "$rc" ;; esac
  if [ "$restarts" -ge __LIMIT__ ]; then
    echo "yardmaster: the command exited $rc and its __LIMIT__ restarts (backoffLimit) are spent" >&2
    exit "$rc"
  fi
  restarts=$((restarts + 1)); delay=$((10 << (restarts - 1))); [ "$delay" -gt 300 ] && delay=300
  echo "yardmaster: the command exited $rc; restartPolicy OnFailure starts it again ($restarts of __LIMIT__) in ${delay}s" >&2
  sleep "$delay"
done"""


def _container_command(
    rank: _Rank, env: Mapping[str, str], exports: Mapping[str, str], errors: _Errors, *, restarts: int = 0
) -> str:
    """The shell line every rank runs: the operator's torchrun variables, the working directory, the command
    (restarted on failure up to ``restarts`` times: restartPolicy OnFailure)."""
    if not rank.command:
        errors.add(
            f"{rank.place}.command",
            "give the command: Yardmaster runs it on the node and cannot run the image's entrypoint",
        )
        return ""
    defined = set(env) | set(_OPERATOR_ENV)
    lines = [
        # What the training operator sets in every pod for torchrun (it reads PET_* as its defaults).
        'export PET_MASTER_ADDR="$MASTER_ADDR" PET_MASTER_PORT="$MASTER_PORT" PET_NODE_RANK="$NODE_RANK"'
        + "".join(f" {k}={shlex.quote(v)}" for k, v in exports.items())
    ]
    if rank.working_dir:
        lines.append(f"cd {shlex.quote(rank.working_dir)} || exit 1")
    line = _command_line([*rank.command, *rank.args], defined)
    if restarts:
        lines.append(_RESTART_LOOP.replace("__COMMAND__", line).replace("__LIMIT__", str(restarts)))
    else:
        lines.append("exec " + line)
    return "\n".join(lines)


def _gpus(rank: _Rank, out: Translation, errors: _Errors) -> None:
    place = f"{rank.place}.resources.limits.{_GPU_RESOURCE}"
    if rank.gpus < 1:
        # A pod without nvidia.com/gpu runs on CPUs in Kubernetes; Yardmaster allocates GPUs, so each
        # replica gets the least it can: one (the command still runs as written).
        out.warnings.append(
            f"{rank.place} asks for no {_GPU_RESOURCE}: Yardmaster runs every replica with GPUs, so each gets one "
            f"(give resources.limits.{_GPU_RESOURCE} to choose)"
        )
        out.set("gpus_per_replica", 1, f"{place} (none given: one)")
        return
    out.set("gpus_per_replica", rank.gpus, place)


def _run_policy(policy: Any, out: Translation, errors: _Errors, *, labels: Mapping[str, Any]) -> None:
    on_failure = out.on_failure
    if policy is None:
        return
    policy = _check_keys("spec.runPolicy", policy, _RUN_POLICY_KEYS, {}, out, errors)
    if "activeDeadlineSeconds" in policy:
        seconds = _int_value("spec.runPolicy.activeDeadlineSeconds", policy["activeDeadlineSeconds"], errors, minimum=1)
        if seconds is not None:
            out.set("time_limit_s", seconds, "spec.runPolicy.activeDeadlineSeconds")
    backoff = policy.get("backoffLimit")
    if on_failure and backoff is not None:
        _int_value("spec.runPolicy.backoffLimit", backoff, errors)
    elif backoff not in (None, 0):
        errors.add(
            "spec.runPolicy.backoffLimit",
            f"{backoff} retries cannot be honoured without restartPolicy: OnFailure (a failed rank is restarted "
            "only then); preempted and lost jobs are requeued anyway. Use 0, remove it, or give restartPolicy: OnFailure",
        )
    if policy.get("suspend") not in (None, False):
        errors.add("spec.runPolicy.suspend", "a suspended job cannot be submitted: remove suspend, submit when it should run")
    scheduling = policy.get("schedulingPolicy")
    if scheduling is not None:
        scheduling = _check_keys("spec.runPolicy.schedulingPolicy", scheduling, _SCHEDULING_POLICY_KEYS, {}, out, errors)
        if "minAvailable" in scheduling:
            n = _int_value("spec.runPolicy.schedulingPolicy.minAvailable", scheduling["minAvailable"], errors, minimum=1)
            replicas = out.fields.get("replicas")
            if n is not None and replicas is not None and n != replicas:
                errors.add(
                    "spec.runPolicy.schedulingPolicy.minAvailable",
                    f"{n} cannot be honoured: Yardmaster starts a gang all or nothing, so all {replicas} replicas; "
                    f"use {replicas} or remove it",
                )
        queue = scheduling.get("queue")
        if queue is not None and "team" not in labels:
            out.set("team", str(queue), "spec.runPolicy.schedulingPolicy.queue")


# --------------------------------------------------------------------------- MPIJob

# mpirun / mpiexec (Open MPI, MPICH/Hydra, Intel MPI) and horovodrun options: how many words each takes.
_MPI_LAUNCHERS = ("mpirun", "mpiexec", "horovodrun", "mpiexec.hydra", "orterun")
_MPI_OPTION_WORDS = {
    **dict.fromkeys(
        ["-np", "--np", "-n", "-c", "-N", "-npernode", "--npernode", "-ppn", "-x", "-H", "--host", "-host", "--hosts",
         "-hostfile", "--hostfile", "-machinefile", "--machinefile", "-f", "-bind-to", "--bind-to", "-map-by", "--map-by",
         "-rank-by", "--rank-by", "-wdir", "--wdir", "-wd", "-output-filename", "--output-filename", "-prefix", "--prefix",
         "-p", "--ssh-port", "--start-timeout", "--network-interface", "-launcher", "-bootstrap"],
        1,
    ),
    **dict.fromkeys(["-mca", "--mca", "-gmca", "--gmca", "-genv", "-env"], 2),
    **dict.fromkeys(
        ["--allow-run-as-root", "-allow-run-as-root", "--oversubscribe", "-oversubscribe", "-tag-output", "--tag-output",
         "-timestamp-output", "--timestamp-output", "-report-bindings", "--report-bindings", "-display-map",
         "--display-map", "-v", "--verbose", "-q", "-quiet", "--quiet", "-noprefix", "--noprefix",
         "--merge-stderr-to-stdout", "-l", "-print-rank-map", "--gloo", "--mpi", "--nccl"],
        0,
    ),
}  # fmt: skip


def _mpijob(spec: Mapping[str, Any], out: Translation, errors: _Errors, *, restarts: int | None) -> None:
    allowed = {"mpiReplicaSpecs", "runPolicy", "slotsPerWorker", "mainContainer", "cleanPodPolicy", "sshAuthMountPath",
               "mpiImplementation", "runLauncherAsWorker", "launcherCreationPolicy"}  # fmt: skip
    for key in spec:
        if key not in allowed:
            errors.add(f"spec.{key}", "is not a field Yardmaster knows here: remove it")
    for key, why in (("sshAuthMountPath", "Yardmaster starts every worker itself, not over ssh"),
                     ("mpiImplementation", "mpirun is not run (see the launcher's command)"),
                     ("launcherCreationPolicy", "there is no separate launcher")):  # fmt: skip
        if key in spec:
            out.warnings.append(f"spec.{key} is ignored: {why}")
    if spec.get("runLauncherAsWorker") not in (None, False):
        errors.add("spec.runLauncherAsWorker", "cannot be honoured: the launcher's command runs on every worker; remove it")
    slots = _int_value("spec.slotsPerWorker", spec.get("slotsPerWorker", 1), errors, minimum=1)
    if slots is not None and slots != 1:
        errors.add(
            "spec.slotsPerWorker",
            f"{slots} cannot be honoured: Yardmaster starts one process per worker; use slotsPerWorker: 1 and start "
            "the per-GPU processes inside it (torchrun --nproc-per-node, or horovodrun -np N -H localhost:N)",
        )
    replica_specs = spec.get("mpiReplicaSpecs")
    if not isinstance(replica_specs, Mapping):
        errors.add("spec.mpiReplicaSpecs", "give Launcher and Worker replica specs")
        return
    ranks: dict[str, _Rank] = {}
    for role, replica in replica_specs.items():
        place = f"spec.mpiReplicaSpecs.{role}"
        if role not in ("Launcher", "Worker"):
            errors.add(place, "is not an MPIJob replica type: Launcher and Worker")
            continue
        rank = _read_rank(role, place, replica, out, errors)
        if rank is not None:
            ranks[role] = rank
    launcher, worker = ranks.get("Launcher"), ranks.get("Worker")
    if launcher is None or worker is None:
        if not errors.by_place:
            errors.add("spec.mpiReplicaSpecs", "an MPIJob needs a Launcher and Workers")
        return
    if launcher.replicas != 1:
        errors.add("spec.mpiReplicaSpecs.Launcher.replicas", "an MPIJob has exactly one Launcher")
    if launcher.gpus:
        errors.add(
            f"{launcher.place}.resources.limits.{_GPU_RESOURCE}",
            "cannot be honoured: there is no separate launcher to give GPUs; give them to the Workers",
        )
    if worker.replicas < 1:
        errors.add("spec.mpiReplicaSpecs.Worker.replicas", "at least one worker")
        return
    if launcher.image and worker.image and launcher.image != worker.image:
        errors.add(f"{worker.place}.image", f"differs from the Launcher's ({launcher.image!r}): a Yardmaster job runs one image")
    if worker.command:
        if worker.command[0].endswith("sshd"):
            out.warnings.append(f"{worker.place}.command (sshd) is not run: Yardmaster starts the workers itself")
        else:
            errors.add(f"{worker.place}.command", "cannot be honoured: every worker runs the Launcher's program; remove it")
    env = dict(launcher.env)
    for key, value in worker.env.items():
        if key in env and env[key] != value:
            errors.add(f"{worker.place}.env", f"{key} is {value!r} here but {env[key]!r} in the Launcher: give it once")
        env[key] = value
    out.set("replicas", worker.replicas, "spec.mpiReplicaSpecs.Worker.replicas")
    _gpus(worker, out, errors)
    if not launcher.command:
        errors.add(f"{launcher.place}.command", "give the launcher's command (mpirun ... PROGRAM)")
        return
    program, working_dir = _strip_mpirun([*launcher.command, *launcher.args], launcher, worker.replicas, env, out, errors)
    if not program:
        return
    _record_image(worker.image or launcher.image, env, out, worker.place if worker.image else launcher.place)
    out.set("env", env, f"{launcher.place}.env")
    program_rank = _Rank("Launcher", 1, 0, None, program, [], env, working_dir or launcher.working_dir, launcher.place)
    program_rank.restart = launcher.restart
    tries = _restarts(program_rank, restarts, out)
    out.set(
        "command",
        _container_command(program_rank, env, {"PET_NNODES": str(worker.replicas)}, errors, restarts=tries),
        f"{launcher.place}.command",
    )


def _strip_mpirun(
    words: list[str], launcher: _Rank, workers: int, env: dict[str, str], out: Translation, errors: _Errors
) -> tuple[list[str], str | None]:
    """The program the launcher's mpirun would start on every worker, with the options that still mean something applied."""
    place = f"{launcher.place}.command"
    if not words or words[0].rsplit("/", 1)[-1] not in _MPI_LAUNCHERS:
        # No mpirun: the launcher's command is the program itself (a Horovod/Gloo or torch.distributed program).
        return words, None
    i, np_value, working_dir, not_applied = 1, None, None, []
    while i < len(words) and words[i].startswith("-"):
        option, _, inline = words[i].partition("=")
        if option == "--":
            i += 1
            break
        count = _MPI_OPTION_WORDS.get(option)
        if count is None:
            errors.add(place, f"mpirun option {option} is not known to Yardmaster's translation: remove it")
            return [], None
        values = [inline] if inline and count == 1 else words[i + 1 : i + 1 + count]
        if len(values) < count:
            errors.add(place, f"mpirun option {option} needs {count} value(s)")
            return [], None
        i += 1 + (0 if inline and count == 1 else count)
        if option in ("-np", "--np", "-n", "-c"):
            np_value = values[0]
        elif option == "-x" and "=" in values[0]:
            key, _, value = values[0].partition("=")
            env[key] = value
        elif option in ("-genv", "-env"):
            env[values[0]] = values[1]
        elif option in ("-wdir", "--wdir", "-wd"):
            working_dir = values[0]
        elif option != "-x":
            not_applied.append(option)
    program = words[i:]
    if not program:
        errors.add(place, "mpirun starts no program: give it after mpirun's options")
        return [], None
    if np_value is not None and np_value != str(workers):
        errors.add(
            place,
            f"mpirun -np {np_value} cannot be honoured: the job has {workers} workers with one slot each; use -np {workers}",
        )
    out.warnings.append(
        f"{place}: {words[0]} is not run: Yardmaster starts {' '.join(program)[:80]!r} once on each of the {workers} "
        "workers with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set (Horovod with Gloo and torch.distributed "
        "read them); the -x variables are set on every worker"
        + (f"; {', '.join(sorted(set(not_applied)))} not applied" if not_applied else "")
    )
    return program, working_dir


# =========================================================================== Slurm batch scripts

_SBATCH = re.compile(r"^#SBATCH(\s+|$)(.*)$")
# short option -> long option (sbatch's own)
_SHORT = {
    "J": "job-name", "N": "nodes", "n": "ntasks", "c": "cpus-per-task", "t": "time", "p": "partition", "q": "qos",
    "A": "account", "o": "output", "e": "error", "D": "chdir", "G": "gpus", "w": "nodelist", "x": "exclude",
    "d": "dependency", "a": "array", "C": "constraint", "W": "wait", "H": "hold", "s": "oversubscribe",
    "i": "input", "k": "no-kill", "m": "distribution", "M": "clusters", "L": "licenses", "B": "extra-node-info",
    "F": "nodefile", "Q": "quiet", "v": "verbose", "S": "core-spec",
}  # fmt: skip
_FLAGS = {"exclusive", "requeue", "no-requeue", "wait", "hold", "oversubscribe", "contiguous", "overcommit", "quiet",
          "verbose", "parsable", "spread-job", "use-min-nodes", "no-kill", "test-only"}  # fmt: skip
# Accepted with a warning: ignoring them does not change what the job computes.
_SLURM_WARN = {
    "mail-type": "mail about jobs is chosen per person in the portal (Notifications → Preferences), not per job",
    "mail-user": "mail goes to the job owner's address, as chosen in the portal (Notifications → Preferences)",
    "comment": "kept nowhere",
    "exclusive": "a replica holds its GPUs alone; other jobs may use the node's other GPUs",
    "open-mode": "the output file is appended to",
    "requeue": "Yardmaster always requeues a preempted or lost job from its checkpoint",
    "hint": "Yardmaster places by GPU topology",
    "threads-per-core": "Yardmaster places by GPU topology",
    "cores-per-socket": "Yardmaster places by GPU topology",
    "sockets-per-node": "Yardmaster places by GPU topology",
    "gpu-bind": "each replica gets CUDA_VISIBLE_DEVICES for its GPUs, NVLink-local where they fit",
    "cpu-bind": "Yardmaster places by GPU topology",
    "distribution": "one replica per node, ranks in node order",
    "wait": "use `yard submit --wait`",
    "parsable": "use `yard submit --json`",
    "quiet": "the CLI prints what it prints",
    "verbose": "the CLI prints what it prints",
    "profile": "no Slurm accounting plugins here",
    "acctg-freq": "no Slurm accounting plugins here",
    "propagate": "resource limits are the node's",
    "uid": "the job runs as its submitter",
    "gid": "the job runs as its submitter",
    "wckey": "usage is accounted by team (`yard report`)",
    "reservation": "Yardmaster reserves for the highest-priority waiting job itself",
    "signal": "a stopped job gets SIGTERM, then SIGKILL after the grace period (YARD_GRACE_PERIOD_S)",
    "tmp": "a replica uses its node's disk",
    "overcommit": "one replica per node",
    "contiguous": "Yardmaster packs a gang into the fewest leaf switches",
    "spread-job": "Yardmaster packs a gang into the fewest leaf switches",
    "network": "the job uses its nodes' network",
    "export-file": "the job's variables come from its own env",
    "get-user-env": "the job's variables come from its own env",
    "container": "the job runs on its nodes' environment",
}  # fmt: skip
# Refused: ignoring them would change the result (where, when or how often the job runs, or what it computes).
_SLURM_REFUSED = {
    "array": "job arrays are not supported: submit one job per task (a loop of `yard submit`)",
    "dependency": "job dependencies are not supported: chain jobs with `yard submit --wait` in your pipeline",
    "begin": "a delayed start is not supported: submit when the job should start",
    "deadline": "deadlines are not supported: give --time",
    "hold": "held jobs are not supported: submit when the job should run",
    "nodelist": "placement is Yardmaster's (topology-aware): a job cannot name its nodes",
    "nodefile": "placement is Yardmaster's (topology-aware): a job cannot name its nodes",
    "exclude": "placement is Yardmaster's (topology-aware): a job cannot exclude nodes",
    "constraint": "choose the GPU type with --partition (or --gres=gpu:TYPE:N); other node features are not known here",
    "no-requeue": "Yardmaster always requeues a preempted or lost job from its checkpoint: remove --no-requeue",
    "clusters": "Yardmaster is one cluster",
    "licenses": "licenses are not tracked",
    "mincpus": "Yardmaster allocates GPUs",
    "test-only": "ask with `yard submit` and read its admission verdict",
    "input": "a job has no standard input",
    "kill-on-invalid-dep": "job dependencies are not supported",
    "core-spec": "Yardmaster allocates GPUs",
    "thread-spec": "Yardmaster allocates GPUs",
    "extra-node-info": "Yardmaster places by GPU topology",
    "ntasks-per-socket": "Yardmaster places by GPU topology",
    "ntasks-per-core": "Yardmaster places by GPU topology",
    "ntasks-per-gpu": "give --ntasks-per-node and --gpus-per-node",
    "mem-bind": "Yardmaster places by GPU topology",
    "batch": "node features are not known here",
    "oversubscribe": "a replica's GPUs are its own",
    "prefer": "node features are not known here",
    "gpu-freq": "GPU clocks are the node's",
}
_SLURM_HONOURED = {
    "job-name", "nodes", "ntasks", "ntasks-per-node", "gpus", "gpus-per-node", "gpus-per-task", "gres", "time",
    "partition", "qos", "account", "output", "error", "chdir", "export", "nice", "priority", "time-min",
    "switches", "cpus-per-task", "cpus-per-gpu", "mem", "mem-per-cpu", "mem-per-gpu", "segment",
}  # fmt: skip
_SHELLS = {"sh", "bash", "dash", "ksh", "zsh"}
_OUTPUT_PATTERNS = {"%j": "${SLURM_JOB_ID}", "%J": "${SLURM_JOB_ID}", "%x": "${SLURM_JOB_NAME}", "%u": "${USER:-$(id -un)}",
                    "%N": "$(hostname -s)", "%n": "${SLURM_NODEID}", "%t": "${SLURM_NODEID}", "%%": "%"}  # fmt: skip


@dataclass
class _Directive:
    option: str
    value: str | None
    line: int
    text: str

    @property
    def place(self) -> str:
        return f"#SBATCH --{self.option}" + (f"={self.value}" if self.value is not None else "") + f" (line {self.line})"


def _directives(script: str, out: Translation, errors: _Errors) -> list[_Directive]:
    """#SBATCH lines as sbatch reads them: up to the first line that is neither blank nor a comment."""
    found: list[_Directive] = []
    in_header = True
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if number == 1 and line.startswith("#!"):
            continue
        match = _SBATCH.match(line)
        if match is None:
            if line and not line.startswith("#"):
                in_header = False
            continue
        if not in_header:
            out.warnings.append(
                f"line {number}: {line[:60]!r} comes after the script's first command; sbatch ignores it, and so does Yardmaster"
            )
            continue
        try:
            words = shlex.split(match.group(2), comments=True)
        except ValueError as exc:
            errors.add(f"line {number}", f"cannot read this #SBATCH line: {exc}")
            continue
        i = 0
        while i < len(words):
            word = words[i]
            i += 1
            if word.startswith("--"):
                option, eq, value = word[2:].partition("=")
                if not eq and option not in _FLAGS and i < len(words) and not words[i].startswith("-"):
                    value, i = words[i], i + 1
                found.append(_Directive(option, value if (eq or value) else None, number, line))
            elif word.startswith("-") and len(word) >= 2 and word[1] in _SHORT:
                option = _SHORT[word[1]]
                short_value = word[2:].lstrip("=") or None
                if short_value is None and option not in _FLAGS and i < len(words) and not words[i].startswith("-"):
                    short_value, i = words[i], i + 1
                found.append(_Directive(option, short_value, number, line))
            else:
                errors.add(f"line {number}", f"{word!r} is not an sbatch option")
    return found


def _slurm_time(text: str) -> int | None:
    """sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS. None: not one of those."""
    days = 0
    if "-" in text:
        day_text, _, text = text.partition("-")
        if not day_text.isdigit():
            return None
        days = int(day_text)
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
            return None
        hours, minutes, seconds = [*map(int, parts), 0, 0][:3]
        return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    parts = text.split(":")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = list(map(int, parts))
    if len(numbers) == 1:
        return numbers[0] * 60
    if len(numbers) == 2:
        return numbers[0] * 60 + numbers[1]
    return (numbers[0] * 60 + numbers[1]) * 60 + numbers[2]


def _gpu_spec(text: str, gpu_types: Sequence[str]) -> tuple[str | None, int] | None:
    """'8', 'h100:8' (and for --gres 'gpu:8', 'gpu:h100:8') -> (type or None, count); None: not a GPU count."""
    parts = text.split(":")
    if parts and parts[0] == "gpu":
        parts = parts[1:]
    if len(parts) == 1 and parts[0].isdigit():
        return None, int(parts[0])
    if len(parts) == 2 and parts[1].isdigit():
        return _known_type(parts[0], gpu_types) or parts[0], int(parts[1])
    return None


def _known_type(name: str, gpu_types: Sequence[str]) -> str | None:
    return next((t for t in gpu_types if t.lower() == name.lower()), None)


def _slurm_memory_mb(d: _Directive, errors: _Errors) -> int | None:
    """sbatch's memory sizes: MB by default, or with a unit K, M, G, T (--mem=64G)."""
    match = re.fullmatch(r"(\d+)([KMGT]?)", (d.value or "").strip(), flags=re.IGNORECASE)
    if match is None or int(match.group(1)) == 0:
        errors.add(d.place, "give a size of at least 1 MB, e.g. 64G (or --mem=0: all of a node's memory)")
        return None
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[match.group(2).upper()]
    return max(1, round(int(match.group(1)) * scale))


def _positive(d: _Directive, errors: _Errors) -> int | None:
    if d.value is None or not d.value.isdigit() or int(d.value) < 1:
        if d.value is not None and re.fullmatch(r"\d+-\d+", d.value):
            low, high = d.value.split("-")
            if low == high:
                return int(low)
            errors.add(d.place, "a range cannot be honoured: a Yardmaster gang has a fixed size; give one number")
            return None
        errors.add(d.place, "give a whole number of at least 1")
        return None
    return int(d.value)


_SRUN_OPTION_WORDS = " ".join(
    sorted(
        {"-n", "-N", "-c", "-G", "-J", "-o", "-e", "-p", "-t", "-w", "-x", "-m", "-D", "--ntasks", "--nodes",
         "--cpus-per-task", "--gpus", "--gres", "--gpus-per-task", "--ntasks-per-node", "--mpi", "--cpu-bind",
         "--export", "--job-name", "--output", "--error", "--partition", "--time", "--chdir", "--distribution",
         "--gpus-per-node", "--mem", "--mem-per-cpu", "--mem-per-gpu", "--nodelist", "--exclude", "--label"} - {"--label"}
    )
)  # fmt: skip

# srun inside the script: the step runs on this node, --ntasks-per-node copies of it, each with its own
# SLURM_PROCID and SLURM_LOCALID (Yardmaster starts the script on every node; Slurm's srun would fan out
# from the first). As Slurm's srun, it forwards the tasks' output whole lines at a time (sed -u: one write
# per line, so two tasks never splice their lines together), prefixed with the task's rank under
# --label/-l. srun's other options are dropped: the step gets the job's shape. `srun -w NODE hostname
# [-i|-I|-s]`, how scripts ask for the head node's address, answers for NODE (from YARD_NODE_ADDRS).
_SRUN_SHIM = r"""_srun_lines() {
  if [ "$1" -eq 1 ]; then sed -u "s/^/$2: /"; else sed -u ""; fi
}
srun() {
  local label=0 target=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --) shift; break ;;
      --label|-l) label=1; shift ;;
      -w|--nodelist) target=$2; shift 2 ;;
      --nodelist=*) target=${1#--nodelist=}; shift ;;
      -w?*) target=${1#-w}; shift ;;
      --*=*) shift ;;
      --*|-?) case " __WORDS__ " in *" $1 "*) shift 2 ;; *) shift ;; esac ;;
      -*) shift ;;
      *) break ;;
    esac
  done
  if [ -n "$target" ] && [ "$1" = hostname ]; then
    target=$(_yard_hostlist_expand "$target" | head -n 1)
    case "$2" in
      -i|--ip-address|-I|--all-ip-addresses) _yard_node_addr "$target" ;;
      -s|--short) printf '%s\n' "${target%%.*}" ;;
      *) printf '%s\n' "$target" ;;
    esac
    return 0
  fi
  if [ "$SLURM_NTASKS_PER_NODE" -le 1 ] && [ "$label" -eq 0 ]; then
    SLURM_LOCALID=0 SLURM_PROCID="$SLURM_NODEID" "$@"
    return $?
  fi
  local i=0 pids="" rc=0 pid rank codes s
  codes=$(mktemp -d) || return 1
  while [ "$i" -lt "$SLURM_NTASKS_PER_NODE" ]; do
    rank=$((SLURM_NODEID * SLURM_NTASKS_PER_NODE + i))
    { SLURM_LOCALID=$i SLURM_PROCID=$rank "$@"; echo $? > "$codes/$i"; } | _srun_lines "$label" "$rank" &
    pids="$pids $!"; i=$((i + 1))
  done
  for pid in $pids; do wait "$pid"; done
  i=0
  while [ "$i" -lt "$SLURM_NTASKS_PER_NODE" ]; do
    s=$(cat "$codes/$i" 2>/dev/null || echo 1); [ "$rc" -eq 0 ] && rc=$s; i=$((i + 1))
  done
  rm -rf "$codes"
  return "$rc"
}"""

# scontrol inside the script: `show hostnames [LIST]` (Slurm's compressed host list, by default
# SLURM_JOB_NODELIST, one name a line; a name that does not resolve here is given as the address the
# portal has for that node, so `scontrol show hostnames | head -n 1` is always a usable rendezvous host)
# and `show job [ID]` (this job, Slurm's key=value form, from the variables). Nothing else of scontrol.
_SCONTROL_SHIM = r"""_yard_hostlist_expand() {
  local list="$1" depth=0 cur="" c i
  for ((i = 0; i < ${#list}; i++)); do
    c=${list:i:1}
    case "$c" in
      "[") depth=$((depth + 1)); cur+=$c ;;
      "]") depth=$((depth - 1)); cur+=$c ;;
      ",") if [ "$depth" -eq 0 ]; then [ -n "$cur" ] && _yard_host_expand "$cur"; cur=""; else cur+=$c; fi ;;
      *) cur+=$c ;;
    esac
  done
  [ -n "$cur" ] && _yard_host_expand "$cur"
  return 0
}
_yard_host_expand() {
  case "$1" in *"["*"]"*) ;; *) printf '%s\n' "$1"; return 0 ;; esac
  local pre=${1%%"["*} rest=${1#*"["} ranges post r lo hi n
  ranges=${rest%%"]"*}; post=${rest#*"]"}
  for r in ${ranges//,/ }; do
    lo=${r%%-*}; hi=${r#*-}
    for ((n = 10#$lo; n <= 10#$hi; n++)); do _yard_host_expand "$pre$(printf "%0${#lo}d" "$n")$post"; done
  done
}
_yard_node_addr() {
  local pair
  for pair in $YARD_NODE_ADDRS; do
    if [ "${pair%%=*}" = "$1" ]; then printf '%s\n' "${pair#*=}"; return 0; fi
  done
  printf '%s\n' "$1"
}
scontrol() {
  local name list
  case "$1 $2" in
    "show hostnames"|"show hostname")
      list=$(IFS=,; echo "${*:3}")
      for name in $(_yard_hostlist_expand "${list:-$SLURM_JOB_NODELIST}"); do
        if getent hosts "$name" > /dev/null 2>&1; then printf '%s\n' "$name"; else _yard_node_addr "$name"; fi
      done ;;
    "show job"|"show jobs"|"show jobid")
      printf 'JobId=%s JobName=%s\n   UserId=%s JobState=RUNNING Restarts=%s\n' \
        "$SLURM_JOB_ID" "$SLURM_JOB_NAME" "${USER:-$(id -un)}" "$SLURM_RESTART_COUNT"
      printf '   NumNodes=%s NumTasks=%s CPUs/Task=%s\n   TRES=gres/gpu=%s\n   NodeList=%s\n   WorkDir=%s\n' \
        "$SLURM_NNODES" "$SLURM_NTASKS" "${SLURM_CPUS_PER_TASK:-1}" "$((SLURM_GPUS_ON_NODE * SLURM_NNODES))" \
        "$SLURM_JOB_NODELIST" "$SLURM_SUBMIT_DIR" ;;
    *)
      echo "scontrol: Yardmaster runs this batch script without Slurm: only 'scontrol show hostnames [LIST]'" \
        "and 'scontrol show job' work here" >&2
      return 1 ;;
  esac
}
export -f _srun_lines srun _yard_hostlist_expand _yard_host_expand _yard_node_addr scontrol"""


def translate_slurm(script: str, *, gpu_types: Sequence[str] = ()) -> Translation:
    """An sbatch script -> a job whose command runs the script on every node, with Slurm's variables and srun."""
    out = Translation(source="slurm")
    errors = _Errors()
    if len(script.encode("utf-8", errors="replace")) > MAX_FILE_BYTES:
        raise _refuse("file", f"A batch script is at most {MAX_FILE_BYTES // 1024} KiB")
    if "\x00" in script:
        raise _refuse("file", "A batch script is text: it must not contain NUL characters")
    first = script.lstrip("\ufeff").split("\n", 1)[0].strip()
    if not first.startswith("#!"):
        raise _refuse(
            "line 1",
            "This does not look like a batch script: the first line must start with #! and an interpreter "
            "(#!/bin/bash), as sbatch requires",
        )
    try:
        shebang = shlex.split(first[2:])
    except ValueError:
        shebang = first[2:].split()
    interpreter = shebang[0].rsplit("/", 1)[-1] if shebang else ""
    if interpreter == "env" and len(shebang) > 1:
        interpreter = shebang[1].rsplit("/", 1)[-1]
    if interpreter not in _SHELLS:
        raise _refuse(
            "line 1",
            f"{first[:60]!r}: Yardmaster runs batch scripts with a shell (#!/bin/bash or #!/bin/sh); run another "
            "interpreter from the script (python3 train.py)",
        )
    directives = _directives(script, out, errors)
    seen: dict[str, _Directive] = {}
    for d in directives:
        if d.option in seen and seen[d.option].value != d.value:
            out.warnings.append(f"{d.place} overrides {seen[d.option].place}, as sbatch does")
        seen[d.option] = d
    nodes = ntasks_per_node = ntasks = None
    gpus_per_node: tuple[int, str] | None = None
    gpus_total: tuple[int, str] | None = None
    gpus_per_task: tuple[int, str] | None = None
    env: dict[str, str] = {}
    gpu_type_from: tuple[str, str] | None = None
    output = error_file = chdir = None
    job_name = None
    sizes: dict[str, tuple[int, _Directive]] = {}  # cpus-per-task, mem-per-gpu, ...: read once the gang is known
    segment: tuple[int, _Directive] | None = None  # --segment: read once the node count is known
    whole_node_memory = False  # --mem=0
    for option, d in seen.items():
        value = d.value
        if option in _SLURM_REFUSED:
            errors.add(d.place, f"cannot be honoured: {_SLURM_REFUSED[option]}")
            continue
        if option in _SLURM_WARN:
            out.warnings.append(f"{d.place} is ignored: {_SLURM_WARN[option]}")
            continue
        if option not in _SLURM_HONOURED:
            out.warnings.append(f"{d.place} is not an sbatch option Yardmaster knows: ignored")
            continue
        if value is None and option != "export":
            errors.add(d.place, "needs a value")
            continue
        assert value is not None or option == "export"
        if option == "job-name":
            job_name = value
            out.set("name", value, d.place)
        elif option == "nodes":
            nodes = _positive(d, errors)
        elif option == "ntasks-per-node":
            ntasks_per_node = _positive(d, errors)
        elif option == "ntasks":
            ntasks = _positive(d, errors)
        elif option in ("gpus-per-node", "gpus", "gpus-per-task", "gres"):
            spec_text = value or ""
            if option == "gres":
                gres = [g for g in spec_text.split(",") if g]
                gpu_gres = [g for g in gres if g.split(":")[0] == "gpu"]
                for other in (g for g in gres if g.split(":")[0] != "gpu"):
                    errors.add(d.place, f"generic resource {other!r} cannot be honoured: Yardmaster allocates GPUs only")
                if len(gpu_gres) != 1:
                    if not gpu_gres:
                        errors.add(d.place, "give gpu:N or gpu:TYPE:N")
                    else:
                        errors.add(d.place, "give one gpu: generic resource")
                    continue
                spec_text = gpu_gres[0]
            parsed = _gpu_spec(spec_text, gpu_types)
            if parsed is None or parsed[1] < 1:
                errors.add(d.place, "give a GPU count: N or TYPE:N (for --gres, gpu:N or gpu:TYPE:N)")
                continue
            gpu_type, count = parsed
            if gpu_type is not None:
                gpu_type_from = (gpu_type, d.place)
            if option in ("gpus-per-node", "gres"):
                if gpus_per_node is not None and gpus_per_node[0] != count:
                    errors.add(d.place, f"says {count} GPUs per node but {gpus_per_node[1]} says {gpus_per_node[0]}")
                gpus_per_node = (count, d.place)
            elif option == "gpus":
                gpus_total = (count, d.place)
            else:
                gpus_per_task = (count, d.place)
        elif option == "time":
            seconds = _slurm_time(value or "")
            if seconds is None:
                if (value or "").upper() in ("UNLIMITED", "INFINITE"):
                    errors.add(d.place, "an unlimited time cannot be honoured: jobs here have a time limit of at most 30 days")
                else:
                    errors.add(d.place, "a time as sbatch takes it: minutes, MM:SS, HH:MM:SS or D-HH:MM:SS")
            else:
                out.set("time_limit_s", seconds, d.place)
        elif option == "time-min":
            out.warnings.append(f"{d.place} is ignored: the job runs up to its --time")
        elif option == "partition":
            parts = [p for p in (value or "").split(",") if p]
            if len(parts) != 1:
                errors.add(d.place, "give one partition: Yardmaster's partitions are GPU types")
                continue
            known = _known_type(parts[0], gpu_types)
            if known is None:
                kinds = ", ".join(gpu_types) or "none registered yet"
                errors.add(d.place, f"no partition {parts[0]!r}: partitions here are GPU types ({kinds})")
                continue
            if gpu_type_from is not None and gpu_type_from[0].lower() != known.lower():
                errors.add(d.place, f"is {known} but {gpu_type_from[1]} asks for {gpu_type_from[0]}")
            out.set("gpu_type", known, d.place)
        elif option == "qos":
            tier = TIER_WORDS.get((value or "").lower())
            if tier is None:
                errors.add(d.place, "no such QOS: production (tier 1), research (tier 2) or spot (tier 3)")
            else:
                out.set("tier", tier, d.place)
        elif option == "account":
            out.set("team", value, d.place)
        elif option == "output":
            output = (value or "", d)
        elif option == "error":
            error_file = (value or "", d)
        elif option == "chdir":
            chdir = value
        elif option == "export":
            _slurm_export(d, env, out, errors)
        elif option in ("nice", "priority"):
            try:
                number = int(value or "0")
            except ValueError:
                errors.add(d.place, "give a whole number")
                continue
            out.set("priority", -number if option == "nice" else number, d.place)
        elif option in ("cpus-per-task", "cpus-per-gpu"):
            if (cores := _positive(d, errors)) is not None:
                sizes[option] = (cores, d)
        elif option == "mem" and re.fullmatch(r"0+[KMGT]?", (value or "").strip(), flags=re.IGNORECASE):
            # Slurm: all of the node's memory. Yardmaster has no whole-node ask: the replica asks for no
            # memory at placement and is held to no memory limit on its node, so it may use all of it.
            whole_node_memory = True
            out.warnings.append(
                f"{d.place} (all of each node's memory): the replicas ask for no memory at placement and have no "
                "memory limit on their nodes, so each may use all of it; other jobs on those nodes may use memory too"
            )
        elif option in ("mem", "mem-per-cpu", "mem-per-gpu"):
            if (mib := _slurm_memory_mb(d, errors)) is not None:
                sizes[option] = (mib, d)
        elif option == "switches":
            # --switches=count[@max-time]: one leaf switch, or wait for one (Yardmaster's "required");
            # with a wait bound or more switches allowed, Yardmaster's own weighing ("auto") decides.
            switches, _, bound = (value or "").partition("@")
            if not switches.strip().isdigit() or int(switches) < 1:
                errors.add(d.place, "give a switch count, e.g. --switches=1 (one leaf switch)")
                continue
            if int(switches) == 1 and not bound:
                out.set("leaf_locality", "required", d.place)
            else:
                out.warnings.append(
                    f"{d.place}: a gang waits for one leaf switch only while that costs less than spanning leaves "
                    "(leaf_locality auto, weighed against YARD_SPAN_SLOWDOWN), not for a count or a fixed time"
                )
        elif option == "segment" and (segment_nodes := _positive(d, errors)) is not None:
            segment = (segment_nodes, d)
    if gpu_type_from is not None and "gpu_type" not in out.fields:
        out.set("gpu_type", gpu_type_from[0], gpu_type_from[1])
    # the gang: nodes x GPUs per node, tasks per node started by srun
    if ntasks is not None:
        if nodes is None:
            if ntasks == 1:
                nodes = 1
            else:
                errors.add(
                    f"#SBATCH --ntasks={ntasks}",
                    "without --nodes cannot be honoured: Yardmaster places whole nodes; give --nodes and --ntasks-per-node",
                )
        elif ntasks_per_node is None:
            if ntasks % nodes:
                errors.add(f"#SBATCH --ntasks={ntasks}", f"does not divide evenly over {nodes} nodes: use --ntasks-per-node")
            else:
                ntasks_per_node = ntasks // nodes
        elif ntasks != nodes * ntasks_per_node:
            errors.add(f"#SBATCH --ntasks={ntasks}", f"is not --nodes × --ntasks-per-node ({nodes} × {ntasks_per_node})")
    nodes = nodes or 1
    ntasks_per_node = ntasks_per_node or 1
    if segment is not None:
        # --segment=N: nodes in segments of N inside one block (a multi-node NVLink domain). One segment
        # for the whole gang is Yardmaster's one_fabric; smaller segments cannot be asked for here.
        if segment[0] >= nodes:
            out.set("one_fabric", True, segment[1].place)
        else:
            out.warnings.append(
                f"{segment[1].place}: a gang is kept inside one NVLink fabric domain whole (one_fabric) or not at all, "
                f"not in segments of {segment[0]} nodes; it is placed by the topology search"
            )
    gpus = gpus_per_node[0] if gpus_per_node else None
    if gpus_total is not None:
        if gpus_total[0] % nodes:
            errors.add(gpus_total[1], f"{gpus_total[0]} GPUs do not divide evenly over {nodes} nodes: use --gpus-per-node")
        elif gpus is not None and gpus != gpus_total[0] // nodes:
            errors.add(gpus_total[1], "disagrees with --gpus-per-node")
        gpus = gpus_total[0] // nodes
    if gpus_per_task is not None:
        wanted = gpus_per_task[0] * ntasks_per_node
        if gpus is not None and gpus != wanted:
            errors.add(gpus_per_task[1], f"× {ntasks_per_node} tasks per node is {wanted}, not the {gpus} GPUs per node")
        gpus = wanted
    if gpus is None:
        errors.add("#SBATCH --gpus-per-node", "give the GPUs per node (--gpus-per-node=N or --gres=gpu:N): jobs here use GPUs")
        gpus = 1
    gpu_place = (gpus_per_node or gpus_total or gpus_per_task or (0, "#SBATCH --gpus-per-node"))[1]
    out.set("replicas", nodes, f"#SBATCH --nodes={nodes}")
    out.set("gpus_per_replica", gpus, gpu_place)
    _slurm_sizes(sizes, gpus=gpus, tasks=ntasks_per_node, out=out, errors=errors)
    if nodes > 1:
        out.warnings.append(
            f"the script runs on each of the {nodes} nodes (Slurm runs it on the first and srun fans out): "
            "its srun steps run once per node as in Slurm, but commands outside srun run on every node; "
            'guard first-node-only work with [ "$SLURM_NODEID" = 0 ]'
        )
        # Slurm's --nodes=N is N distinct nodes: each replica on a node of its own, never two on one.
        out.set("one_per_node", True, f"#SBATCH --nodes={nodes}")
    out.warnings.extend(_body_warnings(script))
    errors.raise_any()
    name = job_name or ""
    if not job_name:
        out.set("name", "sbatch", "sbatch's name for a script without --job-name")  # a ?name= default wins
    extra = ""
    if "cpus_per_replica" in out.fields and "cpus-per-task" in sizes:
        extra += f" SLURM_CPUS_PER_TASK={sizes['cpus-per-task'][0]}"
    if "memory_mb_per_replica" in out.fields:
        extra += f" SLURM_MEM_PER_NODE={out.fields['memory_mb_per_replica']}"
    elif whole_node_memory:
        extra += " SLURM_MEM_PER_NODE=0"
    if "gpu_type" in out.fields:
        extra += f" SLURM_JOB_PARTITION={shlex.quote(str(out.fields['gpu_type']))}"
    header = [
        "# Slurm's variables, from Yardmaster's (this job was translated from an sbatch script)",
        'export SLURM_JOB_ID="$YARD_JOB_ID" SLURM_JOBID="$YARD_JOB_ID" SLURM_NNODES="$WORLD_SIZE" '
        'SLURM_JOB_NUM_NODES="$WORLD_SIZE" SLURM_NODEID="$NODE_RANK" SLURM_PROCID="$NODE_RANK" SLURM_LOCALID=0 '
        'SLURM_GPUS_ON_NODE="$YARD_NUM_GPUS" SLURM_SUBMIT_DIR="$PWD" SLURM_RESTART_COUNT=$((YARD_ATTEMPT - 1))',
        f"export SLURM_NTASKS_PER_NODE={ntasks_per_node} SLURM_NTASKS=$(({ntasks_per_node} * WORLD_SIZE)) "
        f'SLURM_NPROCS=$(({ntasks_per_node} * WORLD_SIZE)) SLURM_TASKS_PER_NODE="{ntasks_per_node}(x$WORLD_SIZE)" '
        f'SLURM_JOB_NAME="${{YARD_JOB_NAME:-{_double_quoted(name)}}}" SLURM_GPUS_PER_NODE={gpus}{extra}',
        # The gang's nodes, rank order, in Slurm's compressed form (the agent's YARD_NODELIST); this node alone
        # under an agent that does not send them.
        'export SLURM_JOB_NODELIST="${YARD_NODELIST:-$(hostname -s)}" SLURM_NODELIST="${YARD_NODELIST:-$(hostname -s)}" '
        'SLURMD_NODENAME="$(hostname -s)" SLURM_CLUSTER_NAME=yardmaster',
        _SRUN_SHIM.replace("__WORDS__", _SRUN_OPTION_WORDS),
        _SCONTROL_SHIM,
    ]
    if chdir:
        header.append(f"cd {shlex.quote(chdir)} || exit 1")
    if output is not None:
        header.append(f'exec > >(tee -a "{_output_path(output[0], output[1], errors)}") 2>&1')
    if error_file is not None:
        header.append(f'exec 2> >(tee -a "{_output_path(error_file[0], error_file[1], errors)}" >&2)')
    errors.raise_any()
    if env:
        out.set("env", env, "#SBATCH --export")
    out.set("command", "\n".join(header) + "\n# ---- the batch script\n" + script, "the script")
    return out


def _double_quoted(text: str) -> str:
    """``text`` for inside a double-quoted shell word: nothing in it is expanded."""
    return "".join("\\" + c if c in '"$`\\' else c for c in text)


# Lines of a batch script that need something on the nodes Yardmaster does not provide.
_BODY_NEEDS = (
    (re.compile(r"^(module|ml)\s+(load|add|use|swap|purge|restore)\b"), "environment modules (module load) must be "
     "installed on the nodes, with these modules; where they are not, this line fails and the script goes on without them"),
    (re.compile(r"^(conda|mamba)\s+activate\b|^(source|\.)\s+activate\b"), "conda and this environment must exist "
     "on every node (the job runs in its nodes' environment)"),
    (re.compile(r"^(source|\.)\s+\S"), "this file must exist on every node; a relative path is read from the job's "
     "working directory ($SLURM_SUBMIT_DIR), not from where it was submitted"),
    (re.compile(r"\bsrun\b.*(\s-w\s*\S|\s--nodelist[=\s])"), "srun -w NODE runs the step on the node running the "
     "script (every node runs it here); only `srun -w NODE hostname [-i|-s]` answers for NODE"),
    (re.compile(r"^(sbatch|squeue|scancel|sacct|salloc|sinfo)\b|\$\((sbatch|squeue|scancel|sacct|salloc|sinfo)\b"),
     "Slurm's other commands do not exist here (only srun and scontrol show hostnames/job do): use yard"),
)  # fmt: skip


# An absolute path to a program or data file the script names (not one of the system's own directories).
_ABSOLUTE_FILE = re.compile(
    r"(?<![\w$}/.-])(/(?!(?:usr|bin|sbin|etc|dev|proc|sys|tmp|lib|lib64|opt/conda)/)[\w.+-]+(?:/[\w.+-]+)*"
    r"\.(?:py|sh|bash|yaml|yml|json|toml|cfg|ini|txt|csv|ckpt|pt|pth|safetensors))(?![\w/])"
)


def _body_warnings(script: str) -> list[str]:
    """What the script's own commands need that Yardmaster's nodes may lack, said at submit."""
    found: list[str] = []
    paths: list[str] = []
    for number, raw in enumerate(script.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        for pattern, why in _BODY_NEEDS:
            if pattern.search(line):
                found.append(f"line {number}: {line[:60]!r}: {why}")
                break
        for path in _ABSOLUTE_FILE.findall(line):
            if path not in paths:
                paths.append(path)
                found.append(f"line {number}: {path} must exist on every node: the job runs on its nodes' file systems")
    return found


def _slurm_sizes(sizes: dict[str, tuple[int, _Directive]], *, gpus: int, tasks: int, out: Translation, errors: _Errors) -> None:
    """Cores and memory per node (a Yardmaster replica is one node's share of the gang), as sbatch counts them."""
    if "cpus-per-task" in sizes and "cpus-per-gpu" in sizes:
        errors.add(sizes["cpus-per-gpu"][1].place, "give --cpus-per-task or --cpus-per-gpu, not both")
    cpus: int | None = None
    if "cpus-per-task" in sizes:
        cpus = sizes["cpus-per-task"][0] * tasks
        out.set("cpus_per_replica", cpus, sizes["cpus-per-task"][1].place)
    elif "cpus-per-gpu" in sizes:
        cpus = sizes["cpus-per-gpu"][0] * gpus
        out.set("cpus_per_replica", cpus, sizes["cpus-per-gpu"][1].place)
    memory = [option for option in ("mem", "mem-per-cpu", "mem-per-gpu") if option in sizes]
    if len(memory) > 1:
        errors.add(sizes[memory[1]][1].place, "give one of --mem, --mem-per-cpu and --mem-per-gpu, as sbatch wants")
    elif memory:
        size, d = sizes[memory[0]]
        if memory[0] == "mem-per-cpu" and cpus is None:
            errors.add(d.place, "needs --cpus-per-task or --cpus-per-gpu: the cores it is per")
            return
        factor = {"mem": 1, "mem-per-gpu": gpus, "mem-per-cpu": cpus or 1}[memory[0]]
        out.set("memory_mb_per_replica", size * factor, d.place)


def _output_path(pattern: str, d: _Directive, errors: _Errors) -> str:
    """--output's file name with sbatch's replacement symbols, as a double-quoted shell word."""
    pieces: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern[i] == "%":
            symbol = pattern[i : i + 2]
            if symbol in _OUTPUT_PATTERNS:
                pieces.append(_OUTPUT_PATTERNS[symbol])
            else:
                errors.add(d.place, f"{symbol!r} is not a file-name symbol Yardmaster fills (%j, %x, %u, %N, %n, %t, %%)")
            i += 2
            continue
        char = pattern[i]
        pieces.append("\\" + char if char in '"$`\\' else char)
        i += 1
    return "".join(pieces)


def _slurm_export(d: _Directive, env: dict[str, str], out: Translation, errors: _Errors) -> None:
    value = d.value or "ALL"
    for item in value.split(","):
        if item in ("ALL", "NIL"):
            out.warnings.append(f"{d.place}: the submitting shell's variables are not sent; give them as --export=NAME=value")
        elif item == "NONE":
            continue
        elif "=" in item:
            key, _, val = item.partition("=")
            if not _ENV_NAME.match(key):
                errors.add(d.place, f"{key!r} is not a variable name")
            else:
                env[key] = val
        else:
            errors.add(d.place, f"{item}: the submitting shell's variables are not sent; give {item}=value")


# =========================================================================== the envelope and defaults


def apply_defaults(translation: Translation, *, team: str | None, name: str | None, only_team: Callable[[], str | None]) -> None:
    """The request's defaults (``?team=``, ``?name=``, the user's only team) where the file gave none."""
    if "team" not in translation.fields:
        chosen = team or only_team()
        if chosen:
            translation.set("team", chosen, "?team=" if team else "your only team")
    if name and ("name" not in translation.fields or translation.origin.get("name", "").startswith("sbatch's name")):
        translation.set("name", name, "?name=")


_HOW_TO_NAME_TEAM = {
    "yardmaster": "give team: in the file",
    "pytorchjob": "give the yardmaster.io/team label or annotation",
    "mpijob": "give the yardmaster.io/team label or annotation",
    "slurm": "give #SBATCH --account=TEAM",
}
_HOW_TO_NAME_JOB = {
    "yardmaster": "give name: in the file",
    "pytorchjob": "give metadata.name",
    "mpijob": "give metadata.name",
    "slurm": "give #SBATCH --job-name=NAME",
}


def missing_hints(translation: Translation) -> dict[str, list[str]]:
    """What the API's validation would call "required", said in the file's own terms."""
    hints: dict[str, list[str]] = {}
    if "team" not in translation.fields:
        hints["team"] = [f"Which team runs this job? {_HOW_TO_NAME_TEAM[translation.source]} (or pass ?team=)"]
    if "name" not in translation.fields:
        hints["name"] = [f"Name the job: {_HOW_TO_NAME_JOB[translation.source]} (or pass ?name=)"]
    return hints


def located(errors: Mapping[str, Any], translation: Translation) -> dict[str, list[str]]:
    """The API's field errors on a translated job, each said with the place in the file the field came from."""
    out: dict[str, list[str]] = {}
    for key, messages in errors.items():
        items = messages if isinstance(messages, list) else [messages]
        origin = translation.origin.get(str(key))
        flat = [str(m) if not isinstance(m, Mapping) else "; ".join(f"{k}: {v}" for k, v in m.items()) for m in items]
        out[str(key)] = [f"{m} (from {origin})" if origin and origin != key else m for m in flat]
    return out
