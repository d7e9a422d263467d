"""What must never be true of the cluster's state, whatever crashed or raced (the tests and the replay
of faults check it after every scenario).

Apart because it reads across jobs, tasks and allocations for no request and no cycle: a check, not a read
the product acts on.
"""

from __future__ import annotations

from django.db.models import Count, F, Q

from scheduling.models import Allocation, Job, Task
from scheduling.states import ACTIVE_STATES, TASK_LIVE_STATES, TERMINAL_STATES, JobState


def invariant_violations() -> list[str]:
    """What must never be true, whatever crashed or raced: empty when the cluster state is sound.

    - a GPU in two live allocations;
    - a half-placed gang: an active job whose current attempt lacks a task per replica, or a live
      task without exactly gpus_per_replica live allocations;
    - live allocations of a task that is no longer live, or of a pending or finished job.
    """
    problems: list[str] = []
    for gpu_id, n in (
        Allocation.objects.filter(released_at__isnull=True)
        .values("gpu_id")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .values_list("gpu_id", "n")
    ):
        problems.append(f"GPU {gpu_id} has {n} live allocations")
    for job in (
        Job.objects.filter(state__in=ACTIVE_STATES)
        .annotate(ntasks=Count("tasks", filter=Q(tasks__attempt=F("attempt"))))
        .exclude(ntasks=F("replicas"))
        .values_list("id", "ntasks", "replicas")
    ):
        problems.append(f"job {job[0]} is active with {job[1]} tasks for {job[2]} replicas")
    for task_id, job_id, n, want in (
        Task.objects.filter(state__in=TASK_LIVE_STATES)
        .annotate(n=Count("allocations", filter=Q(allocations__released_at__isnull=True)))
        .exclude(n=F("job__gpus_per_replica"))
        .values_list("id", "job_id", "n", "job__gpus_per_replica")
    ):
        problems.append(f"task {task_id} of job {job_id} is live with {n} live allocations, needs {want}")
    stray = Allocation.objects.filter(released_at__isnull=True).filter(
        ~Q(task__state__in=TASK_LIVE_STATES) | Q(job__state=JobState.PENDING) | Q(job__state__in=TERMINAL_STATES)
    )
    for alloc_id, job_id, state in stray.values_list("id", "job_id", "job__state"):
        problems.append(f"allocation {alloc_id} of job {job_id} ({state}) is live but its task or job is not")
    return problems
