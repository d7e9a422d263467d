"""A node's live tasks, with their jobs and owners, as the heartbeat reads them: one statement, compiled
once per thread (``tenants.compiled.CompiledQuery``), its rows made into instances without
``Model.__init__`` (25 a beat on a node with 8 tasks were a fifth of its CPU).

This is the one read of a steady heartbeat, the call every node makes every few seconds.
tests/agent_api/test_heartbeat.py checks the tasks, jobs and owners equal the ORM's, attribute for attribute.
"""

from __future__ import annotations

from django.db.models import QuerySet

from scheduling.models import Allocation, Node, Task
from scheduling.states import TASK_LIVE_STATES
from tenants.compiled import CompiledQuery

# What a heartbeat reads of a task, its job and the job's owner: nothing it does not send or decide on.
_TASK_FIELDS = (
    "id", "job_id", "attempt", "rank", "node_id", "state", "master_addr", "master_port", "gpu_indices", "started_at",
    "checkpoint_at", "notebook_url", "notebook_kernel_busy", "notebook_last_activity",
    "cpu_used", "memory_used_mb", "memory_peak_mb",
    "job__id", "job__name", "job__kind", "job__replicas", "job__cpus_per_replica", "job__memory_mb_per_replica", "job__command",
    "job__env", "job__checkpoint_dir", "job__time_limit_s",
    "job__stop_requested_at", "job__stop_reason", "job__stop_grace_s", "job__last_checkpoint_at", "job__attempt",
    "job__state", "job__user_id", "job__user__id", "job__user__username",
    "job__team_id", "job__image", "job__container_mounts", "job__container_workdir",
    "service_url", "service_ready", "service_restarts", "service_last_restart_at", "service_crash_looping", "service_message",
    "dev_endpoint", "dev_login", "dev_host_key", "dev_connections", "dev_last_activity",
    "job__service_id", "job__service_revision", "job__service__id", "job__service__port", "job__service__readiness_path",
    "job__service__liveness_path", "job__service__probe_period_s", "job__service__probe_timeout_s",
    "job__service__failure_threshold", "job__service__success_threshold", "job__service__initial_delay_s",
)  # fmt: skip


def live_tasks_of(*, node: Node) -> list[Task]:
    """The node's live tasks with their jobs and owners, in one query: each task carries its GPU indices
    (Task.gpu_indices, written at placement). Tasks made before that field existed get theirs from
    their live allocations, in one more query."""
    tasks = _LIVE_TASKS.objects(node.pk)
    missing = [t for t in tasks if not t.gpu_indices]
    if missing:
        by_task: dict[int, list[int]] = {}
        live = Allocation.objects.filter(task__in=missing, released_at__isnull=True).order_by("gpu__index")
        for task_id, index in live.values_list("task_id", "gpu__index"):
            by_task.setdefault(task_id, []).append(index)
        for task in missing:
            task.gpu_indices = by_task.get(task.pk, [])
    return tasks


def live_tasks_queryset(node_id: int) -> QuerySet[Task]:
    return (
        Task.objects.filter(node_id=node_id, state__in=TASK_LIVE_STATES)
        .select_related("job__user", "job__service")
        .only(*_TASK_FIELDS)
        .order_by("job_id", "rank")
    )


# The live-task query, compiled once per thread and connection and run with each node's id
# (tenants/compiled.py): compiling it was half the CPU of a heartbeat, the path every node calls every few
# seconds, and its shape never changes. tests/agent_api/test_heartbeat.py checks it gives what the ORM gives.
_LIVE_TASKS: CompiledQuery[Task] = CompiledQuery(live_tasks_queryset, -7_340_033)
