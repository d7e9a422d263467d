"""A task's status and log reports, and an agent's own drain request."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from scheduling import services as scheduling_services
from scheduling.agent.services.reports import (
    StaleAttempt,
    StatusReport,
    TaskNotFound,
    epoch,
)  # fmt: skip
from scheduling.models import (
    Job,
    Node,
    NodeState,
    Task,
    TaskLogChunk,
)
from scheduling.states import TASK_LIVE_STATES, TaskState

# --------------------------------------------------------------------------- task status, logs, drain


# An agent that stops work on its own account says why; the job then ends as if the portal had
# ordered it: past its time limit it fails with TIME_LIMIT, and work stopped because the agent lost
# the portal is requeued (the node's fault, not the job's) instead of failing on exit status 143.
# "agent_lost": the node's watchdog stopped it because its agent was gone (killed or hung) too long.
# "node_fault": the node could not start it (its disk is full): the job is requeued, elsewhere.
_AGENT_STOP_REASONS = {
    "time_limit": "TIME_LIMIT",
    "portal_unreachable": "PREEMPTED",
    "agent_lost": "PREEMPTED",
    "node_fault": "NODE_FAULT",
    "image_pull": "IMAGE_PULL",
}
_AGENT_STOP_NOTES = {
    "TIME_LIMIT": "the agent stopped it past its time limit",
    "PREEMPTED": "its agent lost the portal",
    "NODE_FAULT": "its node could not start it",
    "IMAGE_PULL": "its node could not pull the image",
}


def _task_of(*, node: Node, task_id: int, lock: bool) -> Task:
    qs = Task.objects.select_related("job").filter(pk=task_id, node=node)
    if lock:
        qs = qs.select_for_update(of=("self",))
    task = qs.first()
    if task is None:
        raise TaskNotFound(task_id)
    return task


@transaction.atomic
def task_report_status(*, node: Node, task_id: int, report: StatusReport) -> Task:
    """Apply a `running` or `exited` report through the scheduling services.

    At-least-once: a repeated report of what the portal already knows is accepted and changes
    nothing. A report about another attempt, or about a task no longer live here (lost with its
    node, or ended), raises StaleAttempt so the agent kills and forgets the process.
    """
    task = _task_of(node=node, task_id=task_id, lock=True)
    if report.attempt != task.attempt:
        raise StaleAttempt(task_id)
    if report.state == "running":
        if task.state == TaskState.ASSIGNED:
            return scheduling_services.task_mark_running(
                task=task,
                pid=report.pid,
                started_at=epoch(report.started_at) or timezone.now(),
                notebook_url=report.notebook_url or "",
            )
        if task.state in (TaskState.RUNNING, TaskState.STOPPING):
            return task  # a repeat, or the start report of a task already told to stop
        raise StaleAttempt(task_id)
    if task.state == TaskState.EXITED:
        return task  # a repeated exit report
    if task.state not in TASK_LIVE_STATES:
        raise StaleAttempt(task_id)
    checkpoint = epoch(report.checkpoint_time)
    if checkpoint is not None:
        # Read by the agent after the process exited: a checkpoint written in the grace period counts,
        # and work lost to a preemption is only what came after it (scheduling/governance/accounting.py).
        Task.objects.filter(pk=task.pk).update(checkpoint_at=checkpoint)
        Job.objects.filter(pk=task.job_id).filter(
            Q(last_checkpoint_at__isnull=True) | Q(last_checkpoint_at__lt=checkpoint)
        ).update(last_checkpoint_at=checkpoint)
        task.job.refresh_from_db(fields=["last_checkpoint_at"])
    stop_reason = _AGENT_STOP_REASONS.get(report.stop_cause or "")
    if stop_reason is not None and task.job.stop_requested_at is None:
        note = _AGENT_STOP_NOTES[stop_reason]
        if stop_reason == "NODE_FAULT" and node.disk_problem:
            note = f"{note}: {node.disk_problem}"
        if stop_reason == "IMAGE_PULL":
            # The agent's line names the image and what the registry said; it is the job's page's and API's
            # stop_message, and the reason of its FAILED event.
            note = f"node {node.name}: {report.message or note}"
            Job.objects.filter(pk=task.job_id, stop_message="").update(stop_message=note)
        scheduling_services.job_request_stop(job=task.job, reason=stop_reason, actor_label=f"agent {node.name}", note=note)
        task.refresh_from_db()
    return scheduling_services.task_mark_exited(
        task=task,
        exit_code=report.exit_code,
        signal=report.signal,
        stopped_by=report.stopped_by or "",
        ended_at=epoch(report.ended_at) or timezone.now(),
    )


@transaction.atomic
def task_log_append(*, node: Node, task_id: int, attempt: int, offset: int, data: str) -> int:
    """Store the part of a log chunk beyond what is stored already; return the stored length.

    Offsets count UTF-8 bytes of the agent's stream. The task row is locked so two deliveries of
    the same chunk cannot both append. A chunk past the stored end (one was lost) is stored where
    it belongs: a hole in a log is better than refusing the rest of it.
    """
    task = _task_of(node=node, task_id=task_id, lock=True)
    if attempt != task.attempt or task.state == TaskState.LOST:
        raise StaleAttempt(task_id)
    raw = data.encode("utf-8")
    stored = task.log_size
    skip = max(0, stored - offset)
    if skip >= len(raw):
        return stored
    tail = raw[skip:]
    start = offset + skip
    # PostgreSQL text cannot hold NUL; the byte count stays the agent's so offsets keep lining up.
    text = tail.decode("utf-8", errors="replace").replace("\x00", "\ufffd")
    TaskLogChunk.objects.create(task=task, offset=start, data=text)
    new_size = start + len(tail)
    Task.objects.filter(pk=task.pk).update(log_size=new_size)
    return new_size


@transaction.atomic
def node_drain(*, node: Node, reason: str, now: datetime | None = None) -> str:
    """Take the node out of placement until an admin resumes it (scheduling.services.node_resume).

    A DOWN node stays DOWN until it is back, and then comes back DRAINING."""
    now = now or timezone.now()
    Node.objects.filter(pk=node.pk).exclude(state__in=(NodeState.DRAINING, NodeState.DOWN)).update(
        state=NodeState.DRAINING, state_reason=reason[:255], state_changed_at=now
    )
    Node.objects.filter(pk=node.pk, hold_reason="").update(hold_reason=reason[:255])
    node.refresh_from_db(fields=["state", "state_reason", "hold_reason"])
    return node.state
