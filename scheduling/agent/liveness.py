"""Node liveness: a node that stops heartbeating goes NOT_READY, then DOWN (its gangs requeued).

Run by the Celery beat task scheduling.agent.tasks.check_nodes. Every state change is a
conditional UPDATE on the node row, so any number of concurrent checkers agree: exactly one of
them moves a node to DOWN, and only that one marks its tasks lost and requeues their jobs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction

from scheduling import services as scheduling_services
from scheduling.models import Job, Node, NodeState

log = logging.getLogger(__name__)

# States from which a silent node may be declared DOWN (DOWN itself is excluded: once is enough).
LOSABLE_STATES = (NodeState.READY, NodeState.NOT_READY, NodeState.DRAINING)


@dataclass
class LivenessReport:
    not_ready: list[str] = field(default_factory=list)
    down: list[str] = field(default_factory=list)
    requeued_jobs: list[int] = field(default_factory=list)


def _mark_down(*, node_id: int, cutoff: datetime, now: datetime) -> tuple[Node, list[Job]] | None:
    """Claim the node for DOWN and lose its tasks, in one transaction; None if another checker won."""
    reason = f"no heartbeat for {settings.YARD['NODE_DOWN_S']:.0f} s: its tasks were lost and their jobs requeued"
    with transaction.atomic():
        claimed = Node.objects.filter(pk=node_id, state__in=LOSABLE_STATES, last_heartbeat__lt=cutoff).update(
            state=NodeState.DOWN, state_reason=reason, state_changed_at=now
        )
        if claimed != 1:
            return None
        node = Node.objects.get(pk=node_id)
        jobs = scheduling_services.node_mark_lost(node=node, reason=f"node {node.name} is down (no heartbeat)")
    return node, jobs


def _timeout(key: str) -> timedelta:
    value = settings.YARD[key]
    assert isinstance(value, int | float), f"YARD[{key!r}] must be a number of seconds"
    return timedelta(seconds=value)


def nodes_check(*, now: datetime) -> LivenessReport:
    """Apply the NOT_READY and DOWN timeouts (YARD["NODE_NOT_READY_S"], YARD["NODE_DOWN_S"]) at ``now``.

    Nodes never heard from (no last_heartbeat: seeded, waiting for their agent) are left alone.
    """
    yard = settings.YARD
    report = LivenessReport()
    not_ready_cutoff = now - _timeout("NODE_NOT_READY_S")
    down_cutoff = now - _timeout("NODE_DOWN_S")
    # DRAINING nodes keep their state (an admin's decision) until they are DOWN.
    stale = Node.objects.filter(state=NodeState.READY, last_heartbeat__lt=not_ready_cutoff)
    report.not_ready = list(stale.values_list("name", flat=True))
    if report.not_ready:
        Node.objects.filter(name__in=report.not_ready, state=NodeState.READY, last_heartbeat__lt=not_ready_cutoff).update(
            state=NodeState.NOT_READY,
            state_reason=f"no heartbeat for {yard['NODE_NOT_READY_S']:.0f} s",
            state_changed_at=now,
        )
    candidates = Node.objects.filter(state__in=LOSABLE_STATES, last_heartbeat__lt=down_cutoff).values_list("pk", flat=True)
    for node_id in list(candidates):
        result = _mark_down(node_id=node_id, cutoff=down_cutoff, now=now)
        if result is None:
            continue
        node, jobs = result
        report.down.append(node.name)
        report.requeued_jobs += [job.pk for job in jobs]
        log.warning("node %s is DOWN; jobs requeued: %s", node.name, [job.pk for job in jobs])
    return report
