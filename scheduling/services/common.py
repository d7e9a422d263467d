"""What every write to jobs shares: the state transition, the stop reasons and limits, the job's event
notes, and the debounced request for a scheduling cycle."""

from __future__ import annotations

import logging
import re
import time

from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from scheduling.models import Job, JobEvent
from scheduling.states import TERMINAL_STATES, JobState, check_transition
from tenants.dispatch import send_task


class StaleState(Exception):
    """The job changed state under us (another process got there first)."""


@transaction.atomic
def job_transition(
    *,
    job: Job,
    to: JobState,
    reason: str,
    actor: User | None = None,
    actor_label: str | None = None,
    **fields: object,
) -> Job:
    """Move ``job`` to ``to`` if legal, with a conditional UPDATE; record the event.

    Raises IllegalTransition for a transition the state machine forbids, and StaleState if
    the row is no longer in the state ``job`` was read in (someone else moved it first).
    """
    check_transition(job.pk, job.state, to)
    now = timezone.now()
    updates: dict[str, object] = {"state": to, "state_changed_at": now, **fields}
    if to == JobState.RUNNING and job.started_at is None:
        updates.setdefault("started_at", now)
    if to in TERMINAL_STATES:
        updates.setdefault("ended_at", now)
    changed = Job.objects.filter(pk=job.pk, state=job.state, attempt=job.attempt).update(**updates)
    if changed != 1:
        raise StaleState(f"job {job.pk} is no longer {job.state} (attempt {job.attempt})")
    JobEvent.objects.create(
        job=job,
        time=now,
        attempt=int(updates.get("attempt", job.attempt)),  # type: ignore[call-overload]
        from_state=job.state,
        to_state=to,
        reason=reason,
        actor=actor if actor is not None and actor.pk else None,
        actor_label=actor_label or (actor.get_username() if actor is not None else "system"),
    )
    for key, value in updates.items():
        setattr(job, key, value)
    return job


# IMAGE_PULL: a node could not pull the job's container image (no such image, credentials refused, registry
# unreachable or not allowed): the job fails, never retried, as another attempt would fail the same way.
STOP_REASONS = ("CANCELLED", "PREEMPTED", "IDLE_TIMEOUT", "TIME_LIMIT", "RANK_FAILED", "NODE_LOST", "NODE_FAULT", "IMAGE_PULL")
# A gang that lost a node cannot go on: its other ranks get a short grace (their checkpoint is the last one).
NODE_LOST_GRACE_S = 10
MAX_REPLICAS = 1024
MAX_GPUS_PER_REPLICA = 16
MAX_TIME_LIMIT_S = 30 * 24 * 3600
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_CYCLE_KICK_KEY = "yard:cycle-kick"
_CYCLE_DEBOUNCE_S = 1
# A requested cycle starts no earlier than its countdown (Celery's ETA), so a job committed up to then is in
# its snapshot; this much is kept back for the clocks of two web hosts.
_CYCLE_DUE_MARGIN_S = 0.2
# When the cycle last asked for (by this process or, as the cache said, another) is due: until then this
# process asks Redis nothing (a CI burst is hundreds of submissions a second, one cycle serves them all).
_cycle_due = 0.0

log = logging.getLogger(__name__)


class IdempotencyConflict(Exception):
    """The same Idempotency-Key was used before for a different job spec."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"this Idempotency-Key was already used for job {job.pk} with a different spec")
        self.job = job


def _label(actor: User | None, actor_label: str | None = None) -> str:
    return actor_label or (actor.get_username() if actor is not None else "system")


def _note(job: Job, reason: str, *, actor: User | None = None, actor_label: str | None = None) -> None:
    """An event that is not a transition (stop ordered, borrowed, ...)."""
    JobEvent.objects.create(
        job=job,
        attempt=job.attempt,
        from_state=job.state,
        to_state="",
        reason=reason,
        actor=actor if actor is not None and actor.pk else None,
        actor_label=_label(actor, actor_label),
    )


def cycle_request() -> None:
    """Ask for a scheduling cycle once the current transaction commits, debounced cluster-wide.

    The first request in a window of _CYCLE_DEBOUNCE_S sets a short cache key and sends one
    run_cycle with that countdown, so a burst of submits or task ends makes one cycle, which
    sees all of them; requests after the window get the next one, and beat covers the rest.
    The key holds when that cycle is due, and a process that knows a cycle is still to come after
    its commit asks neither Redis nor the broker: one round trip a window per process, not one a job.
    """
    transaction.on_commit(_kick_cycle)


def _kick_cycle() -> None:
    global _cycle_due
    now = time.time()
    if now < _cycle_due - _CYCLE_DUE_MARGIN_S:
        return  # committed before that cycle starts: it will see this change
    try:
        due = now + _CYCLE_DEBOUNCE_S
        if cache.add(_CYCLE_KICK_KEY, due, timeout=_CYCLE_DEBOUNCE_S):
            # By name: the task module imports the cycle, which imports this one.
            send_task("scheduling.tasks.run_cycle", countdown=_CYCLE_DEBOUNCE_S)
        else:
            # Another process asked first; an older key (a plain 1) says nothing of when: ask again next time.
            other = cache.get(_CYCLE_KICK_KEY)
            due = float(other) if isinstance(other, float) else 0.0
        _cycle_due = due
    except Exception:  # the broker or cache being down must not fail a submit; beat runs the cycle anyway
        log.warning("could not request a scheduling cycle", exc_info=True)
