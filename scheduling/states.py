"""The job and task state machines: the one place that says which transitions are legal.

PREEMPTED and LOST are passing states: a preempted or lost job is requeued (PENDING,
attempt + 1) with its checkpoint directory, and both steps are recorded as events.
"""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    PENDING = "PENDING", "Pending"
    STARTING = "STARTING", "Starting"
    RUNNING = "RUNNING", "Running"
    PREEMPTING = "PREEMPTING", "Preempting"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"
    PREEMPTED = "PREEMPTED", "Preempted"
    LOST = "LOST", "Lost"


J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    J.PENDING: frozenset({J.STARTING, J.CANCELLED, J.FAILED}),
    J.STARTING: frozenset({J.RUNNING, J.COMPLETED, J.FAILED, J.CANCELLED, J.PREEMPTING, J.LOST}),
    J.RUNNING: frozenset({J.COMPLETED, J.FAILED, J.CANCELLED, J.PREEMPTING, J.LOST}),
    J.PREEMPTING: frozenset({J.PREEMPTED, J.COMPLETED, J.FAILED, J.CANCELLED, J.LOST}),
    J.PREEMPTED: frozenset({J.PENDING}),
    J.LOST: frozenset({J.PENDING}),
    J.COMPLETED: frozenset(),
    J.FAILED: frozenset(),
    J.CANCELLED: frozenset(),
}
TERMINAL_STATES = frozenset(s for s, nxt in JOB_TRANSITIONS.items() if not nxt)
# States in which a job may hold GPUs.
ACTIVE_STATES = frozenset({J.STARTING, J.RUNNING, J.PREEMPTING})


class IllegalTransition(Exception):
    def __init__(self, job_id: object, current: str, target: str) -> None:
        allowed = ", ".join(sorted(JOB_TRANSITIONS[JobState(current)])) or "none (terminal)"
        super().__init__(f"job {job_id}: {current} → {target} is not allowed; from {current}: {allowed}")
        self.current, self.target = current, target


def check_transition(job_id: object, current: str, target: str) -> None:
    if JobState(target) not in JOB_TRANSITIONS[JobState(current)]:
        raise IllegalTransition(job_id, current, target)


class TaskState(models.TextChoices):
    ASSIGNED = "ASSIGNED", "Assigned"  # placed, the agent has not started it yet
    RUNNING = "RUNNING", "Running"
    STOPPING = "STOPPING", "Stopping"  # told to stop (SIGTERM sent / to be sent)
    EXITED = "EXITED", "Exited"
    LOST = "LOST", "Lost"  # its node went DOWN


T = TaskState
TASK_TRANSITIONS: dict[TaskState, frozenset[TaskState]] = {
    T.ASSIGNED: frozenset({T.RUNNING, T.STOPPING, T.EXITED, T.LOST}),
    T.RUNNING: frozenset({T.STOPPING, T.EXITED, T.LOST}),
    T.STOPPING: frozenset({T.EXITED, T.LOST}),
    T.EXITED: frozenset(),
    T.LOST: frozenset(),
}
TASK_LIVE_STATES = frozenset({T.ASSIGNED, T.RUNNING, T.STOPPING})
