"""The service controller: keeps each service's replica jobs as wanted (docs/services.md, "The controller").

Per service, under its row lock (so two workers, or a person's change and the autoscaler, never make two
replicas for one gap), in this order:

1. drained replicas whose drain has lasted YARD_SERVICE_DRAIN_S are told to stop (SIGTERM, grace);
2. a service being deleted drains everything, and is DELETED once nothing is left;
3. the autoscaler sets how many replicas are wanted (in-flight requests per replica, with a cool-down);
4. a rollout in progress is rolled back if its new replicas failed or missed the progress deadline;
5. replicas are made (one at a time beyond the wanted count during a rollout: surge one) or drained.

It never places anything: a replica job queues like any gang, with its reason and ETA. Every decision is
conditional on the rows it read (a job already draining or stopped is left alone), so running it twice
changes nothing the second time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from scheduling.models import Job, JobEvent, RolloutState, Service, ServiceRevision, ServiceState
from scheduling.models.serving import REVISION_SHAPE_FIELDS
from scheduling.services import StaleState, job_request_stop, job_submit, job_transition
from scheduling.serving.selectors import Replica, active_services, replicas_of, service_stats
from scheduling.serving.services import replica_job_spec
from scheduling.states import ACTIVE_STATES, IllegalTransition, JobState
from tenants.services import audit

log = logging.getLogger(__name__)

LABEL = "service controller"
# The grace a replica leaving gets between SIGTERM and SIGKILL (its drain is over: nothing is sent to it).
STOP_GRACE_S = 30
# A surge replica that has waited this long for room: drain an old one first, down to replicas - 1 ready.
SURGE_WAIT_S = 30.0
# In a rollout, this many failed (never ready) replicas of the new revision roll it back at once.
ROLLOUT_FAILURES = 2
# The autoscaler's view of load: mean in-flight requests over the last UP window to grow (a surge is met
# within seconds), over the last (longer) window to shrink (a lull must last), as Kubernetes' HPA behaves.
AUTOSCALE_UP_WINDOW_S = 10.0
AUTOSCALE_WINDOW_S = 30.0
# Three crashes in a row make the agent say crash-looping; the controller tells people once per streak.


@dataclass
class Outcome:
    made: list[int] = field(default_factory=list)
    drained: list[int] = field(default_factory=list)
    stopped: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _drain_s() -> float:
    return float(cast(float, settings.YARD["SERVICE_DRAIN_S"]))


def reconcile_all(*, now: datetime | None = None) -> dict[str, int]:
    """Reconcile every active service; one failing (a bug, a lost lock) never stops the others."""
    done = {"services": 0, "made": 0, "drained": 0, "stopped": 0}
    for pk in list(active_services().values_list("pk", flat=True)):
        try:
            outcome = reconcile(service_id=pk, now=now)
        except Exception:
            log.exception("service %s: the controller failed; it tries again at its next tick", pk)
            continue
        done["services"] += 1
        done["made"] += len(outcome.made)
        done["drained"] += len(outcome.drained)
        done["stopped"] += len(outcome.stopped)
    return done


@transaction.atomic
def reconcile(*, service_id: int, now: datetime | None = None) -> Outcome:
    now = now or timezone.now()
    service = Service.objects.select_for_update().select_related("team", "user").get(pk=service_id)
    outcome = Outcome()
    replicas = replicas_of(service=service)
    _finish_drains(service, replicas, now=now, outcome=outcome)
    if service.state == ServiceState.DELETING:
        _delete(service, replicas, now=now, outcome=outcome)
        return outcome
    if service.state != ServiceState.ACTIVE:
        return outcome
    _notice_crash_loops(service, replicas, now=now)
    _autoscale(service, replicas, now=now)
    if service.rollout_state == RolloutState.PROGRESSING and _rollout_failed(service, replicas, now=now):
        _roll_back(service, now=now)
    _converge(service, replicas, now=now, outcome=outcome)
    _rollout_done(service, replicas_of(service=service))
    return outcome


# --------------------------------------------------------------------------- leaving


def _leaving(r: Replica) -> bool:
    return r.draining or r.stopping


def _drain(service: Service, replica: Replica, *, now: datetime, why: str, outcome: Outcome) -> None:
    """Out of the proxy's rotation now; stopped once the drain is over. A replica that was never ready
    (pending, starting) has nothing in flight: it is stopped at once."""
    job = replica.job
    if job.state == JobState.PENDING:
        try:
            job_transition(job=job, to=JobState.CANCELLED, reason=f"{why} (never placed)", actor_label=LABEL)
            Job.objects.filter(pk=job.pk).update(pending_reason="", estimated_start=None, reservation_domain="")
        except (StaleState, IllegalTransition):  # placed since we read it: drained like a running one next tick
            log.info("service %s: replica job %s moved on while being cancelled", service.pk, job.pk)
            return
        outcome.stopped.append(job.pk)
        return
    was_ready = replica.ready
    if not Job.objects.filter(pk=job.pk, drain_started_at__isnull=True, stop_requested_at__isnull=True).update(
        drain_started_at=now
    ):
        return
    job.drain_started_at = now
    outcome.drained.append(job.pk)
    JobEvent.objects.create(job=job, time=now, attempt=job.attempt, reason=f"draining: {why}", actor_label=LABEL)
    if not was_ready:
        _stop(job, why=why, outcome=outcome)


def _stop(job: Job, *, why: str, outcome: Outcome) -> None:
    if job.state in ACTIVE_STATES and job.stop_requested_at is None:
        job_request_stop(job=job, reason="CANCELLED", grace_s=STOP_GRACE_S, actor_label=LABEL, note=why)
        outcome.stopped.append(job.pk)


def _finish_drains(service: Service, replicas: Sequence[Replica], *, now: datetime, outcome: Outcome) -> None:
    due = now - timedelta(seconds=_drain_s())
    for r in replicas:
        if r.job.drain_started_at is not None and r.job.drain_started_at <= due and r.job.stop_requested_at is None:
            _stop(r.job, why="drained: out of the proxy's rotation", outcome=outcome)


def _delete(service: Service, replicas: Sequence[Replica], *, now: datetime, outcome: Outcome) -> None:
    for r in replicas:
        if not _leaving(r):
            _drain(service, r, now=now, why="the service is being deleted", outcome=outcome)
    if not replicas:
        Service.objects.filter(pk=service.pk, state=ServiceState.DELETING).update(state=ServiceState.DELETED, deleted_at=now)
        audit(
            actor=None, actor_label=LABEL, action="service.deleted", obj=service, unit=service.team, message=f"{service}: deleted"
        )


# --------------------------------------------------------------------------- autoscaling


def _autoscale(service: Service, replicas: Sequence[Replica], *, now: datetime) -> None:
    """Wanted = ceil(in-flight / target per replica) within [min, max]: up on the last AUTOSCALE_UP_WINDOW_S
    at once, down on the last AUTOSCALE_WINDOW_S (and never below what the recent load needs) after the
    cool-down."""
    if not service.autoscaled:
        return

    def needed(seconds: float) -> tuple[int, float]:
        inflight = service_stats(service=service, seconds=seconds, now=now).inflight
        wanted = math.ceil(inflight / service.target_inflight - 1e-9) if inflight > 0 else 0
        return max(service.min_replicas, min(service.max_replicas, wanted)), inflight

    recent, recent_inflight = needed(AUTOSCALE_UP_WINDOW_S)
    if recent > service.replicas:
        wanted, inflight, window = recent, recent_inflight, AUTOSCALE_UP_WINDOW_S
    else:
        settled, inflight = needed(AUTOSCALE_WINDOW_S)
        wanted, window = max(settled, recent), AUTOSCALE_WINDOW_S
    if wanted == service.replicas:
        return
    since = (now - service.last_scaled_at).total_seconds() if service.last_scaled_at else math.inf
    if wanted < service.replicas and since < service.scale_cooldown_s:
        return  # scale down only once the load has stayed low a whole cool-down
    if wanted > service.replicas and since < min(service.scale_cooldown_s, 15.0):
        return  # a scale-up's replicas need time to start before the next step is judged
    before = service.replicas
    Service.objects.filter(pk=service.pk).update(replicas=wanted, last_scaled_at=now)
    service.replicas, service.last_scaled_at = wanted, now
    audit(
        actor=None,
        actor_label="autoscaler",
        action="service.autoscale",
        obj=service,
        unit=service.team,
        message=f"{service}: {before} → {wanted} replicas "
        f"({inflight:.1f} requests in flight over {window:.0f} s, "
        f"target {service.target_inflight:g} per replica)",
    )


# --------------------------------------------------------------------------- rollouts


def _failed_new(service: Service) -> list[Job]:
    """Replica jobs of the current revision that ended FAILED since the rollout began (image pull, bad command)."""
    since = service.rollout_started_at or service.created_at
    return list(
        Job.objects.filter(service=service, service_revision=service.revision, state=JobState.FAILED, ended_at__gte=since)
    )


def _rollout_failed(service: Service, replicas: Sequence[Replica], *, now: datetime) -> bool:
    if service.rollout_from is None:
        return False  # the first revision has nothing to go back to
    failed = _failed_new(service)
    if len(failed) >= ROLLOUT_FAILURES:
        service.rollout_message = f"{len(failed)} replicas of revision {service.revision} failed to start"
        return True
    started = service.rollout_started_at or now
    if (now - started).total_seconds() < service.progress_deadline_s:
        return False
    new_ready = sum(1 for r in replicas if r.revision == service.revision and r.ready)
    if new_ready >= service.replicas:
        return False
    service.rollout_message = (
        f"revision {service.revision} had {new_ready} of {service.replicas} replicas ready after "
        f"{service.progress_deadline_s} s (progress deadline)"
    )
    return True


def _roll_back(service: Service, *, now: datetime) -> None:
    """Back to the revision the rollout started from: its replicas are current again (none is restarted),
    the new revision's are drained by _converge as replicas of an old revision."""
    failed, back = service.revision, service.rollout_from
    assert back is not None
    old = ServiceRevision.objects.filter(service=service, number=back).first()
    for name, value in ((old.shape if old else None) or {}).items():
        if name in REVISION_SHAPE_FIELDS:
            setattr(service, name, value)
    why = service.rollout_message
    service.revision, service.rollout_from = back, failed
    service.rollout_state = RolloutState.ROLLED_BACK
    service.rollout_message = f"rolled back from revision {failed} to {back}: {why}"
    service.save()
    audit(
        actor=None,
        actor_label=LABEL,
        action="service.rolled_back",
        obj=service,
        unit=service.team,
        message=f"{service}: {service.rollout_message}",
        data={"service": service.pk, "from_revision": failed, "to_revision": back},
    )


def _rollout_done(service: Service, replicas: Sequence[Replica]) -> None:
    if service.rollout_state != RolloutState.PROGRESSING:
        return
    current = [r for r in replicas if not _leaving(r)]
    if any(r.revision != service.revision for r in current):
        return
    ready = sum(1 for r in current if r.ready)
    if ready >= service.replicas:
        message = f"revision {service.revision} ready on {ready} replica{'s' if ready != 1 else ''}"
        Service.objects.filter(pk=service.pk).update(rollout_state=RolloutState.COMPLETE, rollout_message=message)
        service.rollout_state, service.rollout_message = RolloutState.COMPLETE, message


# --------------------------------------------------------------------------- making and draining


def _converge(service: Service, replicas: Sequence[Replica], *, now: datetime, outcome: Outcome) -> None:
    want = service.replicas
    current = [r for r in replicas if not _leaving(r)]
    new = [r for r in current if r.revision == service.revision]
    old = [r for r in current if r.revision != service.revision]
    ready = [r for r in current if r.ready]
    if not old:
        if len(new) < want:
            for _ in range(want - len(new)):
                if not _make(service, now=now, outcome=outcome):
                    break
        elif len(new) > want:
            for r in _least_wanted(service, new, now=now)[: len(new) - want]:
                _drain(service, r, now=now, why=f"scaled down to {want}", outcome=outcome)
        return
    # A rollout: old replicas that are not ready go first (they serve nothing); then, for each new replica
    # that is ready, one old one; a surge replica beyond the wanted count while the old still serve.
    for r in [r for r in old if not r.ready]:
        _drain(service, r, now=now, why=f"replaced by revision {service.revision}", outcome=outcome)
    old_ready = [r for r in old if r.ready]
    new_ready = [r for r in new if r.ready]
    surplus = len(new_ready) + len(old_ready) - want
    for r in _least_wanted(service, old_ready, now=now)[: max(surplus, 0)]:
        _drain(service, r, now=now, why=f"replaced by revision {service.revision}", outcome=outcome)
        old_ready.remove(r)
    live_count = len(new) + len(old_ready)
    if len(new) < want and live_count < want + 1:
        _make(service, now=now, outcome=outcome)
        return
    # The surge replica waits for room: make room from an old one, keeping want - 1 ready.
    waiting = [r for r in new if r.job.state == JobState.PENDING]
    if waiting and old_ready and len(ready) - 1 >= want - 1:
        oldest_wait = min(r.job.submitted_at for r in waiting)
        if (now - oldest_wait).total_seconds() >= SURGE_WAIT_S and not any(
            r.draining for r in replicas if r.revision != service.revision
        ):
            victim = _least_wanted(service, old_ready, now=now)[0]
            _drain(
                service, victim, now=now, why=f"making room for revision {service.revision} (no room to surge)", outcome=outcome
            )


def _least_wanted(service: Service, replicas: Sequence[Replica], *, now: datetime) -> list[Replica]:
    """Which replicas to end first: the not-ready (pending, then starting), then the least loaded
    (in-flight requests at the proxy), then the newest."""
    load: dict[int, float] = {}
    if any(r.ready for r in replicas):
        stats = service_stats(service=service, seconds=AUTOSCALE_WINDOW_S, now=now)
        load = {job_id: v["inflight"] for job_id, v in stats.per_replica.items()}

    def key(r: Replica) -> tuple[int, float, float]:
        rank = 0 if r.job.state == JobState.PENDING else 1 if not r.ready else 2
        return (rank, load.get(r.job.pk, 0.0), -r.job.submitted_at.timestamp())

    return sorted(replicas, key=key)


def _make(service: Service, *, now: datetime, outcome: Outcome) -> bool:
    """One replica job at the current revision; False (and a note) if it cannot be made now."""
    wait = _failure_backoff(service, now=now)
    if wait is not None:
        outcome.notes.append(wait)
        return False
    revision = ServiceRevision.objects.get(service=service, number=service.revision)
    spec = replica_job_spec(service=service, revision=revision)
    try:
        job = job_submit(user=service.user, spec=spec, service_revision=(service.pk, revision.number))
    except ValidationError as exc:
        message = "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
        log.warning("service %s: cannot make a replica: %s", service, message)
        if service.rollout_message != f"cannot make a replica: {message}"[:2000]:
            Service.objects.filter(pk=service.pk).update(rollout_message=f"cannot make a replica: {message}"[:2000])
        outcome.notes.append(message)
        return False
    outcome.made.append(job.pk)
    return True


def _failure_backoff(service: Service, *, now: datetime) -> str | None:
    """After replicas of this revision failed (to pull, to start), wait before the next: 10 s doubling per
    failure in the last 10 minutes, at most 5 minutes, so a broken release does not make a job a second."""
    recent = list(
        Job.objects.filter(
            service=service, service_revision=service.revision, state=JobState.FAILED, ended_at__gte=now - timedelta(minutes=10)
        )
        .order_by("-ended_at")
        .values_list("ended_at", flat=True)[:10]
    )
    if not recent or recent[0] is None:
        return None
    wait = min(10.0 * 2 ** (len(recent) - 1), 300.0)
    if (now - recent[0]).total_seconds() >= wait:
        return None
    return (
        f"{len(recent)} replica(s) of revision {service.revision} failed recently: the next is made {wait:.0f} s after the last"
    )


# --------------------------------------------------------------------------- telling people


def _notice_crash_loops(service: Service, replicas: Sequence[Replica], *, now: datetime) -> None:
    """One audit row (and so one notification) per replica attempt that the agent says is crash-looping."""
    from tenants.models import AuditEntry

    for r in replicas:
        if not r.crash_looping or r.task is None:
            continue
        key = f"{r.job.pk}/{r.job.attempt}"
        if AuditEntry.objects.filter(action="service.crash_loop", object_id=str(service.pk), data__replica=key).exists():
            continue
        data: dict[str, Any] = {
            "service": service.pk,
            "replica": key,
            "job": r.job.pk,
            "restarts": r.restarts,
            "node": r.task.node.name if r.task.node_id else "",
        }
        audit(
            actor=None,
            actor_label=LABEL,
            action="service.crash_loop",
            obj=service,
            unit=service.team,
            message=f"{service}: replica job {r.job.pk} is crash-looping on {data['node']} ({r.restarts} restarts): "
            f"{r.task.service_message or 'see its log'}",
            data=data,
        )
