"""The `desired` list's entries (docs/agent-api.md): what an agent needs to run or stop each live task.

Apart from heartbeat.py because it is the contract with the agent, not the heartbeat's writes: it
reads a task, its job and its gang and turns them into the spec the agent acts on (command, GPUs,
CPUs and memory, the gang's nodes, the image and, at launch only, its registry credential). It writes
nothing; heartbeat.py calls it for every live task it returns.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.conf import settings

from scheduling.models import Job, JobKind, Task
from scheduling.registry_credentials import credential_for_image
from scheduling.states import TaskState


def gang_nodes(tasks: Sequence[Task]) -> dict[tuple[int, int], list[tuple[str, str]]]:
    """(job, attempt) -> its replicas' nodes in rank order, (name, address), for the multi-node ones among
    ``tasks``: one statement for all of them (a batch script's SLURM_JOB_NODELIST, docs/agent-api.md)."""
    keys = {(t.job_id, t.attempt) for t in tasks if t.job.replicas > 1}
    if not keys:
        return {}
    out: dict[tuple[int, int], list[tuple[str, str]]] = {}
    rows = (
        Task.objects.filter(job_id__in={j for j, _ in keys}, attempt__in={a for _, a in keys})
        .order_by("job_id", "attempt", "rank")
        .values_list("job_id", "attempt", "node__name", "node__address")
    )
    for job_id, attempt, name, address in rows:
        if (job_id, attempt) in keys:
            out.setdefault((job_id, attempt), []).append((name, address or name))
    return out


def task_spec(task: Task, nodes: Sequence[tuple[str, str]] | None = None) -> dict[str, object]:
    """One entry of `desired` (docs/agent-api.md): what the agent needs to run or stop the task.
    ``nodes``: the gang's nodes in rank order (``gang_nodes``); none: this task's node alone."""
    job = task.job
    stopping = job.stop_requested_at is not None or task.state == TaskState.STOPPING
    spec: dict[str, object] = {
        "task_id": task.pk,
        "job_id": job.pk,
        "attempt": task.attempt,
        # The owner's portal username: an agent run with --run-as-owner runs the task as that local account.
        "user": job.user.get_username() if job.user_id else "",
        "kind": job.kind,
        # One process per replica: torchrun inside it starts the replica's local ranks.
        "rank": task.rank,
        "world_size": job.replicas,
        "node_rank": task.rank,
        "local_rank": 0,
        "master_addr": task.master_addr,
        "master_port": task.master_port,
        # The job's name and its replicas' nodes, rank order: a batch script's SLURM_JOB_NAME and nodelist.
        "job_name": job.name,
        "nodes": [list(n) for n in nodes or ()],  # empty: this node alone (the agent's name and address)
        "gpus": list(task.gpu_indices),
        # What the replica was given beside its GPUs: the agent holds its processes to them where the
        # OS lets it (cgroup v2), and the scheduler placed it where they were free.
        "cpus": job.cpus_per_replica,
        "memory_mb": job.memory_mb_per_replica,
        "command": job.command,
        "env": {str(k): str(v) for k, v in (job.env or {}).items()},
        "checkpoint_dir": job.checkpoint_dir or None,
        "time_limit_s": job.time_limit_s or None,
        "action": "stop" if stopping else "run",
        "grace_s": job.stop_grace_s if job.stop_requested_at else settings.YARD["GRACE_PERIOD_S"],
        "stop_reason": (job.stop_reason or "stop requested") if stopping else None,
        # The portal has recorded the task as started: the agent need not report its start again.
        "started": task.state != TaskState.ASSIGNED,
    }
    if job.kind == JobKind.SERVICE and job.service_id is not None:
        spec["service"] = _service_spec(job)
    if job.kind == JobKind.DEV:
        spec["dev"] = _dev_spec(job)
    if job.image:  # a host job's spec has no "container" entry, as before images existed
        spec["container"] = _container_spec(job, launching=task.state == TaskState.ASSIGNED and not stopping)
    return spec


def _container_spec(job: Job, *, launching: bool) -> dict[str, object]:
    """The job's image for the agent (docs/containers.md). The team's registry
    credential is opened only for a task the agent may be about to launch (it asks the registry at
    launch only), so a running task's heartbeats never carry, or cost, a password."""
    return {
        "image": job.image,
        "mounts": [dict(m) for m in job.container_mounts or []],
        "workdir": job.container_workdir or None,
        "auth": credential_for_image(team_id=job.team_id, image=job.image) if launching else None,
    }


# An in-place restart waits 1 s, doubling per crash in a row, up to this (Kubernetes' CrashLoopBackOff).
SERVICE_BACKOFF_MAX_S = 300.0


def _service_spec(job: Job) -> dict[str, object]:
    """A service replica's probes and port for its agent (docs/services.md). The agent serves on
    ``port`` (the rendezvous port the cycle picked at rank 0's address: MASTER_PORT, free there), given
    to the server in $PORT; rank 0 alone is probed and reached."""
    service = job.service
    assert service is not None
    return {
        "service_id": service.pk,
        "revision": job.service_revision,
        "readiness_path": service.readiness_path,
        "liveness_path": service.liveness_path or None,
        "period_s": service.probe_period_s,
        "timeout_s": service.probe_timeout_s,
        "failure_threshold": service.failure_threshold,
        "success_threshold": service.success_threshold,
        "initial_delay_s": service.initial_delay_s,
        "backoff_max_s": SERVICE_BACKOFF_MAX_S,
    }


def _dev_spec(job: Job) -> dict[str, object]:
    """A dev session's sshd for its agent (docs/dev-sessions.md): the owner's public keys (only theirs get
    in), and what the deployment allows beyond a shell. Its port is the entry's master_port (free at the
    node's address, as a job's MASTER_PORT is)."""
    from tenants.models import SshKey

    keys = list(SshKey.objects.filter(user_id=job.user_id).order_by("pk").values_list("public_key", flat=True))
    return {
        "authorized_keys": keys,
        "allow_agent_forwarding": bool(settings.YARD.get("DEV_ALLOW_AGENT_FORWARDING", False)),
        "allow_tcp_forwarding": bool(settings.YARD.get("DEV_ALLOW_TCP_FORWARDING", False)),
        "allow_x11_forwarding": bool(settings.YARD.get("DEV_ALLOW_X11_FORWARDING", False)),
    }
