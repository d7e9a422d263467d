"""What every write to jobs shares: the state transition, the stop reasons and limits, the job's event
notes, and the debounced request for a scheduling cycle."""

from __future__ import annotations

import logging
import math
import re
import time
from typing import cast

from django.conf import settings
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
# The last cycle's wall seconds, as every cycle writes it (scheduling/cycle.py's CYCLE_SECONDS_CACHE_KEY;
# that module imports this one, so the name is repeated here and a test holds the two equal).
_LAST_CYCLE_S_KEY = "yard:last_cycle_s"
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

    The first request in a window (cycle_window: 1 s, or twice the last cycle's length under a long
    queue) sets a short cache key and sends one run_cycle with that countdown, so a burst of submits
    or task ends makes one cycle, which sees all of them; requests after the window get the next
    one, and beat covers the rest.
    The key holds when that cycle is due, and a process that knows a cycle is still to come after
    its commit asks neither Redis nor the broker: one round trip a window per process, not one a job.
    """
    transaction.on_commit(_kick_cycle)


def cycle_window(last_cycle_s: object) -> int:
    """Whole seconds from a requested cycle to the next that requests may ask for: twice the last cycle's
    length, rounded up, at least _CYCLE_DEBOUNCE_S and at most the beat's interval (beat runs one then
    anyway). A burst of submissions behind a long queue, where each cycle walks the whole queue, then
    keeps the worker in cycles at most half the time instead of back to back (docs/scale.md, "Eight
    clients"); a cycle of under half a second is asked for a second out, as before. Whole seconds: the
    cache's timeouts are, and the key must not outlive the cycle it announces."""
    longest = max(_CYCLE_DEBOUNCE_S, int(cast(float, settings.YARD["CYCLE_INTERVAL_S"])))
    seconds = last_cycle_s if isinstance(last_cycle_s, int | float) and last_cycle_s > 0 else 0.0
    return min(max(_CYCLE_DEBOUNCE_S, math.ceil(2 * seconds)), longest)


def _kick_cycle() -> None:
    global _cycle_due
    now = time.time()
    if now < _cycle_due - _CYCLE_DUE_MARGIN_S:
        return  # committed before that cycle starts: it will see this change
    try:
        # One round trip for both: whether a cycle is asked for already, and how long the last one took.
        known = cache.get_many([_CYCLE_KICK_KEY, _LAST_CYCLE_S_KEY])
        other = known.get(_CYCLE_KICK_KEY)
        if other is None:
            window = cycle_window(known.get(_LAST_CYCLE_S_KEY))
            due = now + window
            if cache.add(_CYCLE_KICK_KEY, due, timeout=window):
                # By name: the task module imports the cycle, which imports this one.
                send_task("scheduling.tasks.run_cycle", countdown=window)
                _cycle_due = due
                return
            other = cache.get(_CYCLE_KICK_KEY)  # another process asked in between
        # Another process asked first; an older key (a plain 1) says nothing of when: ask again next time.
        _cycle_due = float(other) if isinstance(other, float) else 0.0
    except Exception:  # the broker or cache being down must not fail a submit; beat runs the cycle anyway
        log.warning("could not request a scheduling cycle", exc_info=True)
