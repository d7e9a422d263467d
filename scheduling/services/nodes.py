"""Writes to nodes: a node lost (its gangs requeued once, whole), and maintenance (drain, resume)."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from scheduling.models import Gpu, Job, Node, NodeState, Task
from scheduling.selectors import yard_number
from scheduling.services.common import NODE_LOST_GRACE_S, _label, _note, cycle_request, job_transition
from scheduling.services.lifecycle import _release, _stop_tasks, job_requeue
from scheduling.states import ACTIVE_STATES, TASK_LIVE_STATES, JobState, TaskState
from tenants.services import audit

# --------------------------------------------------------------------------- node loss


def node_mark_lost(*, node: Node, reason: str) -> list[Job]:
    """The node's live tasks are LOST (their GPUs freed: the node is DOWN and fences them on return);
    every gang with a rank there is requeued once, whole, from its checkpoint.

    A gang's ranks on other, live nodes are told to stop (a short grace: the gang is broken) and keep
    their GPUs until their agents confirm the stop; the job is requeued when its last rank has ended
    (``_settle``), so no GPU is handed on while a process may still use it and attempt N+1 never runs
    beside a rank of attempt N. Each job is handled in its own transaction with its row locked, so two
    callers (the liveness check twice, or concurrently) lose it exactly once: the second finds no live
    task on the node. Returns the jobs lost.
    """
    lost: list[Job] = []
    job_ids = sorted(set(Task.objects.filter(node=node, state__in=TASK_LIVE_STATES).values_list("job_id", flat=True)))
    for job_id in job_ids:
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=job_id)
            now = timezone.now()
            here = list(Task.objects.filter(job=job, node=node, state__in=TASK_LIVE_STATES).values_list("pk", "attempt"))
            Task.objects.filter(pk__in=[pk for pk, _ in here]).update(state=TaskState.LOST, ended_at=now)
            _release([pk for pk, _ in here], now)
            if job.state not in ACTIVE_STATES or all(attempt != job.attempt for _, attempt in here):
                continue  # an older attempt's leftovers: ending them is all there is to do
            others = Task.objects.filter(job=job, attempt=job.attempt, state__in=TASK_LIVE_STATES)
            if others.exists():
                _note(
                    job, f"node {node.name} lost ({reason}): stopping the other ranks before the requeue", actor_label="scheduler"
                )
                forced = Job.objects.filter(pk=job.pk, attempt=job.attempt).update(
                    stop_requested_at=now, stop_reason="NODE_LOST", stop_grace_s=NODE_LOST_GRACE_S
                )
                if forced:  # overrides any earlier stop order: the gang cannot finish without that rank
                    _stop_tasks(job)
            else:
                job_transition(job=job, to=JobState.LOST, reason=f"node {node.name} lost: {reason}", actor_label="scheduler")
                job = job_requeue(job=job, reason=f"node {node.name} lost", actor_label="scheduler")
            audit(
                actor=None, actor_label="scheduler", action="job.lost", obj=job, unit=None, message=f"node {node.name}: {reason}"
            )
            lost.append(job)
    return lost


# --------------------------------------------------------------------------- node maintenance (drain / resume)

DRAIN_REASON_MAX = 200


@transaction.atomic
def node_hold(*, node: Node, reason: str, actor: User | None, actor_label: str | None = None) -> Node:
    """Drain ``node`` and keep it drained until an admin resumes it (Slurm's ``scontrol … state=drain``).

    No new work lands on it; running work is left to finish (cancel or requeue it to empty the node
    sooner). The hold survives the node going DOWN and coming back: it returns DRAINING, not READY.
    """
    reason = " ".join(reason.split())
    if not reason:
        raise ValidationError({"reason": "Say why the node is drained (for example 'replace GPU 3'): the cluster map shows it."})
    if len(reason) > DRAIN_REASON_MAX:
        raise ValidationError({"reason": f"Keep the reason under {DRAIN_REASON_MAX} characters (it has {len(reason)})."})
    label = _label(actor, actor_label)
    text = f"{reason} ({label})"
    node = Node.objects.select_for_update().get(pk=node.pk)
    fields = ["hold_reason"]
    node.hold_reason = text
    if node.state in (NodeState.READY, NodeState.NOT_READY):
        node.state, node.state_reason, node.state_changed_at = NodeState.DRAINING, f"drained: {text}", timezone.now()
        fields += ["state", "state_reason", "state_changed_at"]
    node.save(update_fields=fields)
    audit(
        actor=actor,
        actor_label=label,
        action="node.drain",
        obj=node,
        message=f"{node.name}: {reason}",
        data={"state": node.state},
    )
    return node


@transaction.atomic
def node_resume(*, node: Node, actor: User | None, actor_label: str | None = None) -> Node:
    """Clear the hold and return the node to placement; its GPUs marked unhealthy (by an XID) count again.

    A node whose agent has gone quiet comes back NOT_READY and turns READY at its next heartbeat; a
    DOWN node keeps its state (its agent's return makes it READY).
    """
    node = Node.objects.select_for_update().get(pk=node.pk)
    if node.state != NodeState.DRAINING and not node.hold_reason:
        raise ValidationError(f"{node.name} is {node.get_state_display()}, not drained: there is nothing to resume.")
    label = _label(actor, actor_label)
    fields = ["hold_reason"]
    node.hold_reason = ""
    if node.state == NodeState.DRAINING:
        fresh_after = timezone.now() - timedelta(seconds=yard_number("NODE_NOT_READY_S"))
        if node.last_heartbeat is not None and node.last_heartbeat >= fresh_after:
            node.state, node.state_reason = NodeState.READY, f"resumed by {label}"
            cycle_request()
        else:
            node.state, node.state_reason = NodeState.NOT_READY, f"resumed by {label}; waiting for its agent's heartbeat"
        node.state_changed_at = timezone.now()
        fields += ["state", "state_reason", "state_changed_at"]
    node.save(update_fields=fields)
    repaired = Gpu.objects.filter(node=node, healthy=False).update(healthy=True)
    audit(
        actor=actor,
        actor_label=label,
        action="node.resume",
        obj=node,
        message=f"{node.name}: {node.get_state_display()}" + (f", {repaired} GPU(s) healthy again" if repaired else ""),
        data={"state": node.state, "gpus_healthy_again": repaired},
    )
    return node
