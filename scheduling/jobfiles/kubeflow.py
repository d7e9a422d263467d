"""Kubeflow manifests (kubeflow.org/v1 PyTorchJob and MPIJob, kubeflow.org/v2beta1 MPIJob): what each level of
a manifest may hold, and the metadata, pod, container and runPolicy reading both kinds share.

pytorchjob.py and mpijob.py read their own kind's spec (its replica specs): translate_manifest(read_spec=...).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from scheduling import images
from scheduling.jobfiles.common import (
    OK,
    TIER_WORDS,
    Errors,
    Translation,
    check_keys,
    int_value,
    quantity,
    read_env,
    string_list,
)

# Kubernetes' Job default for backoffLimit: the restarts a rank with restartPolicy OnFailure gets when
# runPolicy.backoffLimit is not given (the training operator itself sets no bound).
DEFAULT_BACKOFF_LIMIT = 6
LABEL_PREFIX = "yardmaster.io/"

# What each level of a manifest may hold: honoured by the translation, accepted because its meaning is
# kept, accepted with a warning (ignoring it does not change what the job computes), or refused.
_TOP_KEYS = {"apiVersion": OK, "kind": OK, "metadata": OK, "spec": OK, "status": OK}
_METADATA_KEYS = {
    "name": OK, "generateName": OK, "labels": OK, "annotations": OK,
    "namespace": "Yardmaster has no namespaces: the team comes from the yardmaster.io/team label or annotation",
    # what `kubectl get -o yaml` adds: the cluster's bookkeeping, not the job's
    "uid": OK, "resourceVersion": OK, "creationTimestamp": OK, "generation": OK, "managedFields": OK,
    "selfLink": OK, "finalizers": OK, "ownerReferences": OK,
}  # fmt: skip
_RUN_POLICY_KEYS = {
    "cleanPodPolicy": OK,  # a job's processes always end with it: nothing is left to clean
    "ttlSecondsAfterFinished": "a finished job stays in Yardmaster's history (its record is not deleted)",
    "activeDeadlineSeconds": OK,  # -> time_limit_s
    "backoffLimit": OK,  # the restarts of a rank with restartPolicy OnFailure; else only 0
    "schedulingPolicy": OK,
    "suspend": OK,  # checked: only false
    "managedBy": "Yardmaster runs the job itself",
}  # fmt: skip
_SCHEDULING_POLICY_KEYS = {
    "minAvailable": OK,  # checked: the whole gang (Yardmaster is all or nothing)
    "queue": OK,  # -> team, when no yardmaster.io/team is given
    "minResources": "Yardmaster admits a gang by its GPUs",
    "scheduleTimeoutSeconds": None,
    "priorityClass": None,
}
_REPLICA_KEYS = {"replicas": OK, "template": OK, "restartPolicy": OK}
_POD_SPEC_KEYS = {
    "containers": OK,
    "restartPolicy": OK,
    "tolerations": "Yardmaster's nodes have no taints to tolerate",
    "schedulerName": "Yardmaster is the gang scheduler",
    "serviceAccountName": "there is no Kubernetes service account on Yardmaster's nodes",
    "serviceAccount": "there is no Kubernetes service account on Yardmaster's nodes",
    "automountServiceAccountToken": "there is no Kubernetes service account on Yardmaster's nodes",
    "imagePullSecrets": "the image is pulled with the team's registry credential (yard registry-credentials, "
    "/api/v1/registry-credentials), not a Kubernetes Secret",
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
    "runtimeClassName": "each node's agent runs containers with the runtime it has (runc): a job cannot choose one",
}
_CONTAINER_KEYS = {
    "name": OK, "image": OK, "command": OK, "args": OK, "env": OK, "workingDir": OK, "resources": OK,
    "terminationMessagePath": OK, "terminationMessagePolicy": OK, "stdin": OK, "stdinOnce": OK, "tty": OK,
    "imagePullPolicy": "every launch asks the registry for the image's digest and pulls what the node's cache "
    "lacks (as Always with a cache; IfNotPresent and Never are not honoured)",
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

GPU_RESOURCE = "nvidia.com/gpu"
# Set by the Kubeflow training operator in every pod, and by Yardmaster's agent (or the command) for every rank.
_OPERATOR_ENV = (
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "NODE_RANK", "LOCAL_RANK", "CUDA_VISIBLE_DEVICES",
    "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE",
    "YARD_JOB_ID", "YARD_ATTEMPT", "YARD_NUM_GPUS", "YARD_CHECKPOINT_DIR", "YARD_WORKDIR",
)  # fmt: skip


@dataclass
class Rank:
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


class SpecReader(Protocol):
    """One kind's reading of a manifest's spec (its replica specs) into the translation."""

    def __call__(self, spec: Mapping[str, Any], out: Translation, errors: Errors, *, restarts: int | None) -> None: ...


def _labels(meta: Mapping[str, Any], out: Translation, errors: Errors) -> dict[str, tuple[str, str]]:
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


def _apply_labels(labels: Mapping[str, tuple[str, str]], out: Translation, errors: Errors) -> None:
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


def read_rank(role: str, place: str, spec: Any, out: Translation, errors: Errors) -> Rank | None:
    spec = check_keys(place, spec, _REPLICA_KEYS, {}, out, errors)
    if not spec:
        return None
    replicas = int_value(f"{place}.replicas", spec.get("replicas", 1), errors)
    _check_restart(f"{place}.restartPolicy", spec.get("restartPolicy"), errors)
    template = check_keys(f"{place}.template", spec.get("template", {}), {"metadata": OK, "spec": OK}, {}, out, errors)
    pod_place = f"{place}.template.spec"
    pod = check_keys(pod_place, template.get("spec", {}), _POD_SPEC_KEYS, _POD_SPEC_REFUSED, out, errors)
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
    container = check_keys(c_place, containers[0], _CONTAINER_KEYS, _CONTAINER_REFUSED, out, errors)
    image = container.get("image")
    if image is not None and not isinstance(image, str):
        errors.add(f"{c_place}.image", "must be a string")
        image = None
    command = string_list(f"{c_place}.command", container.get("command"), errors)
    args = string_list(f"{c_place}.args", container.get("args"), errors) or []
    env = read_env(f"{c_place}.env", container.get("env"), errors)
    working_dir = container.get("workingDir")
    if working_dir is not None and not isinstance(working_dir, str):
        errors.add(f"{c_place}.workingDir", "must be a string")
        working_dir = None
    # An MPIJob's launcher is not a replica here (Yardmaster runs no launcher pod): its cores and memory size nothing.
    gpus = _read_resources(f"{c_place}.resources", container.get("resources"), out, errors, sizes=role != "Launcher")
    if replicas is None:
        return None
    restart = spec.get("restartPolicy") or pod.get("restartPolicy")
    return Rank(role, replicas, gpus, image, command, args, env, working_dir, c_place, restart)


def _check_restart(place: str, policy: Any, errors: Errors) -> None:
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


def _read_resources(place: str, value: Any, out: Translation, errors: Errors, *, sizes: bool = True) -> int:
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
            if resource == GPU_RESOURCE:
                n = int_value(where, amount, errors)
                if n is not None:
                    gpus[kind] = n
            elif resource in ("cpu", "memory") and not sizes:
                out.warnings.append(f"{where} is ignored: Yardmaster runs no launcher pod; mpirun's work runs on the workers")
            elif resource in ("cpu", "memory"):
                # A replica gets what its largest pod asks (requests, as Kubernetes schedules on them;
                # else limits): one replica is one pod here.
                n = quantity(where, amount, memory=resource == "memory", errors=errors)
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
                errors.add(where, f"cannot be honoured: Yardmaster allocates whole {GPU_RESOURCE} GPUs only")
    if "limits" in gpus and "requests" in gpus and gpus["limits"] != gpus["requests"]:
        errors.add(f"{place}.requests.{GPU_RESOURCE}", "must equal the limit (as Kubernetes requires for GPUs)")
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


def translate_manifest(data: Mapping[str, Any], *, kind: str, read_spec: SpecReader) -> Translation:
    """A manifest of ``kind``: its metadata, labels and runPolicy read here, its replica specs by ``read_spec``."""
    out = Translation(source=kind.lower())
    errors = Errors()
    check_keys("manifest", data, _TOP_KEYS, {}, out, errors)
    meta = check_keys("metadata", data.get("metadata") or {}, _METADATA_KEYS, {}, out, errors)
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
    read_spec(spec, out, errors, restarts=restarts)
    _run_policy(policy, out, errors, labels=labels)
    errors.raise_any()
    return out


def record_image(image: str | None, out: Translation, place: str, errors: Errors, *, working_dir: str | None = None) -> None:
    """The container's image is the job's: every rank runs in it, pulled by the node's agent (docs/containers.md),
    and an absolute workingDir is where it starts in the container."""
    if not image:
        return
    try:
        reference = str(images.parse_image(image))  # as the job keeps it: docker.io/library/python:3.12
    except images.ImageError as exc:
        errors.add(f"{place}.image", str(exc))
        return
    out.set("image", reference, f"{place}.image")
    if working_dir and working_dir.startswith("/"):
        out.set("container_workdir", working_dir, f"{place}.workingDir")


def restart_limit(rank: Rank, backoff: int | None, out: Translation) -> int:
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


def container_command(
    rank: Rank, env: Mapping[str, str], exports: Mapping[str, str], errors: Errors, *, restarts: int = 0
) -> str:
    """The shell line every rank runs: the operator's torchrun variables, the working directory, the command
    (restarted on failure up to ``restarts`` times: restartPolicy OnFailure)."""
    if not rank.command:
        errors.add(
            f"{rank.place}.command",
            "give the command: Yardmaster runs each rank's command, not an image's entrypoint, from a job file",
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


def set_gpus(rank: Rank, out: Translation, errors: Errors) -> None:
    place = f"{rank.place}.resources.limits.{GPU_RESOURCE}"
    if rank.gpus < 1:
        # A pod without nvidia.com/gpu runs on CPUs in Kubernetes; Yardmaster allocates GPUs, so each
        # replica gets the least it can: one (the command still runs as written).
        out.warnings.append(
            f"{rank.place} asks for no {GPU_RESOURCE}: Yardmaster runs every replica with GPUs, so each gets one "
            f"(give resources.limits.{GPU_RESOURCE} to choose)"
        )
        out.set("gpus_per_replica", 1, f"{place} (none given: one)")
        return
    out.set("gpus_per_replica", rank.gpus, place)


def _run_policy(policy: Any, out: Translation, errors: Errors, *, labels: Mapping[str, Any]) -> None:
    on_failure = out.on_failure
    if policy is None:
        return
    policy = check_keys("spec.runPolicy", policy, _RUN_POLICY_KEYS, {}, out, errors)
    if "activeDeadlineSeconds" in policy:
        seconds = int_value("spec.runPolicy.activeDeadlineSeconds", policy["activeDeadlineSeconds"], errors, minimum=1)
        if seconds is not None:
            out.set("time_limit_s", seconds, "spec.runPolicy.activeDeadlineSeconds")
    backoff = policy.get("backoffLimit")
    if on_failure and backoff is not None:
        int_value("spec.runPolicy.backoffLimit", backoff, errors)
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
        scheduling = check_keys("spec.runPolicy.schedulingPolicy", scheduling, _SCHEDULING_POLICY_KEYS, {}, out, errors)
        if "minAvailable" in scheduling:
            n = int_value("spec.runPolicy.schedulingPolicy.minAvailable", scheduling["minAvailable"], errors, minimum=1)
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
