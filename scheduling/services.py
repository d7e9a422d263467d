"""Writes to jobs and the cluster. Keyword-only, atomic, conditional state changes, audited."""

from __future__ import annotations

from django.contrib.auth.models import User
from django.db import transaction
from django.utils import timezone

from scheduling.models import Job, JobEvent
from scheduling.states import TERMINAL_STATES, JobState, check_transition


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
