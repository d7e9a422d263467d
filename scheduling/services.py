"""Writes to jobs and the cluster. Keyword-only, atomic, conditional state changes, audited."""

from __future__ import annotations

import logging
import posixpath
import re
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from scheduling.core.capacity import Capacity, refusal
from scheduling.core.eta import admit as eta_admit
from scheduling.core.types import LeafLocality, PendingJob, Verdict
from scheduling.core.types import Tier as CoreTier
from scheduling.models import LEAF_LOCALITY_CHOICES, Allocation, Gpu, Job, JobEvent, JobKind, Node, NodeState, Task
from scheduling.selectors import cluster_capacity, quota_chain, snapshot_build, yard_number
from scheduling.states import ACTIVE_STATES, TASK_LIVE_STATES, TERMINAL_STATES, JobState, TaskState, check_transition
from tenants.models import OrgUnit
from tenants.services import audit


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


# =========================================================================== the job lifecycle
# Everything below is the contract of docs: services-contract (submit, cancel, stop, requeue,
# task reports, node loss). Each change is conditional (a second caller finds nothing to do)
# and leaves a JobEvent; user actions and scheduler decisions leave an AuditEntry too.

STOP_REASONS = ("CANCELLED", "PREEMPTED", "IDLE_TIMEOUT", "TIME_LIMIT", "RANK_FAILED", "NODE_LOST", "NODE_FAULT")
# A gang that lost a node cannot go on: its other ranks get a short grace (their checkpoint is the last one).
NODE_LOST_GRACE_S = 10
MAX_REPLICAS = 1024
MAX_GPUS_PER_REPLICA = 16
MAX_TIME_LIMIT_S = 30 * 24 * 3600
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
_CYCLE_KICK_KEY = "yard:cycle-kick"
_CYCLE_DEBOUNCE_S = 1

log = logging.getLogger(__name__)


class IdempotencyConflict(Exception):
    """The same Idempotency-Key was used before for a different job spec."""

    def __init__(self, job: Job) -> None:
        super().__init__(f"this Idempotency-Key was already used for job {job.pk} with a different spec")
        self.job = job


@dataclass(frozen=True)
class JobSpec:
    name: str
    team: OrgUnit
    tier: int = 2
    kind: str = "batch"
    replicas: int = 1
    gpus_per_replica: int = 1
    gpu_type: str = "H100"
    command: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    time_limit_s: int | None = None
    checkpoint_dir: str = ""
    priority: int = 0
    leaf_locality: str = "auto"
    one_fabric: bool = False  # all its nodes in one multi-node NVLink domain, or wait (Slurm's --segment)
    one_per_node: bool = False  # each replica on a node of its own (Slurm's --nodes=N: N distinct nodes)
    # None: the deployment's default per GPU of a replica (``with_default_resources``).
    cpus_per_replica: int | None = None
    memory_mb_per_replica: int | None = None


def with_default_resources(spec: JobSpec) -> JobSpec:
    """The spec with its cores and memory per replica filled in where it left them out: the deployment's
    YARD_DEFAULT_CPUS_PER_GPU and YARD_DEFAULT_MEMORY_MB_PER_GPU times the replica's GPUs."""
    if spec.cpus_per_replica is not None and spec.memory_mb_per_replica is not None:
        return spec
    cpus, memory_mb = resources_of(spec)
    return replace(spec, cpus_per_replica=cpus, memory_mb_per_replica=memory_mb)


def resources_of(spec: JobSpec) -> tuple[int, int]:
    """The spec's cores and MiB per replica, the defaults where it left them out."""
    gpus = max(spec.gpus_per_replica, 1) if isinstance(spec.gpus_per_replica, int) else 1
    cpus = spec.cpus_per_replica
    memory_mb = spec.memory_mb_per_replica
    return (
        cpus if cpus is not None else int(yard_number("DEFAULT_CPUS_PER_GPU")) * gpus,
        memory_mb if memory_mb is not None else int(yard_number("DEFAULT_MEMORY_MB_PER_GPU")) * gpus,
    )


def job_spec_of(job: Job, **changes: Any) -> JobSpec:
    """A job's own spec, to submit again ("Run again", ``POST /jobs/{id}/rerun``), with ``changes``. The copy
    gets its own checkpoint directory."""
    fields: dict[str, Any] = {
        "name": job.name,
        "team": job.team,
        "tier": job.tier,
        "kind": job.kind,
        "replicas": job.replicas,
        "gpus_per_replica": job.gpus_per_replica,
        "gpu_type": job.gpu_type,
        "command": job.command,
        "env": dict(job.env or {}),
        "time_limit_s": job.time_limit_s,
        "priority": job.priority,
        "leaf_locality": job.leaf_locality,
        "one_fabric": job.one_fabric,
        "one_per_node": job.one_per_node,
        "cpus_per_replica": job.cpus_per_replica,
        "memory_mb_per_replica": job.memory_mb_per_replica,
    }
    fields.update(changes)
    return JobSpec(**fields)


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
    """
    transaction.on_commit(_kick_cycle)


def _kick_cycle() -> None:
    from scheduling.tasks import run_cycle

    try:
        if cache.add(_CYCLE_KICK_KEY, 1, timeout=_CYCLE_DEBOUNCE_S):
            run_cycle.apply_async(countdown=_CYCLE_DEBOUNCE_S)
    except Exception:  # the broker or cache being down must not fail a submit; beat runs the cycle anyway
        log.warning("could not request a scheduling cycle", exc_info=True)


# --------------------------------------------------------------------------- submit


def _default_time_limit() -> int:
    return int(yard_number("DEFAULT_TIME_LIMIT_S"))


def _team_dir(team: OrgUnit) -> PurePosixPath:
    return PurePosixPath(str(settings.YARD["CHECKPOINT_ROOT"])) / team.slug


NEVER_RUNS = "This job can never run"


def _validate_spec(*, user: User, spec: JobSpec, capacity: Capacity | None = None) -> None:
    """Field errors a person can fix, keyed by field, all at once."""
    from tenants.selectors import teams_submittable

    errors: dict[str, list[str]] = defaultdict(list)
    if not spec.name.strip():
        errors["name"].append("Give the job a name")
    elif len(spec.name) > 200:
        errors["name"].append("At most 200 characters")
    if not teams_submittable(user=user).filter(pk=spec.team.pk).exists():
        errors["team"].append("You cannot submit jobs for this team")
    if spec.tier not in (1, 2, 3):
        errors["tier"].append("Tier is 1 (production), 2 (research) or 3 (spot)")
    if spec.kind not in JobKind.values:
        errors["kind"].append(f"Kind is one of {', '.join(JobKind.values)}")
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        errors["replicas"].append(f"Between 1 and {MAX_REPLICAS}")
    if spec.kind == JobKind.NOTEBOOK and spec.replicas != 1:
        errors["replicas"].append("A notebook runs as one replica")
    if not 1 <= spec.gpus_per_replica <= MAX_GPUS_PER_REPLICA:
        errors["gpus_per_replica"].append(f"Between 1 and {MAX_GPUS_PER_REPLICA}")
    if not spec.gpu_type or len(spec.gpu_type) > 32:
        errors["gpu_type"].append("Name a GPU type, e.g. H100")
    elif spec.gpu_type not in (known := (capacity or cluster_capacity()).types):
        # On the field it is about (the admission check would say it as a non-field error); the prefix is
        # what the API's never_runnable answer and `yard submit` (exit 121) recognise.
        errors["gpu_type"].append(
            f"{NEVER_RUNS}: the cluster has no {spec.gpu_type} GPUs (it has: {', '.join(known) or 'none yet'})"
        )
    if spec.time_limit_s is not None and not 60 <= spec.time_limit_s <= MAX_TIME_LIMIT_S:
        errors["time_limit_s"].append(f"Between 60 and {MAX_TIME_LIMIT_S} seconds")
    if not -1000 <= spec.priority <= 1000:
        errors["priority"].append("Between -1000 and 1000")
    if spec.leaf_locality not in {value for value, _ in LEAF_LOCALITY_CHOICES}:
        errors["leaf_locality"].append("One of auto, required, preferred")
    if spec.cpus_per_replica is not None and not 1 <= spec.cpus_per_replica <= 1024:
        errors["cpus_per_replica"].append("Between 1 and 1024 CPU cores per replica")
    if spec.memory_mb_per_replica is not None and not 1 <= spec.memory_mb_per_replica <= 16 * 1024 * 1024:
        errors["memory_mb_per_replica"].append("Between 1 MiB and 16 TiB per replica")
    if len(spec.command) > 100_000:
        errors["command"].append("At most 100000 characters")
    elif spec.kind == JobKind.BATCH and not spec.command.strip():
        # A batch job without one would start nothing on every rank and end COMPLETED, exit 0.
        errors["command"].append("A batch job needs a command: what each replica runs, e.g. torchrun --nproc-per-node 8 train.py")
    if not isinstance(spec.env, Mapping) or len(spec.env) > 200:
        errors["env"].append("A mapping of at most 200 variables")
    else:
        for key, value in spec.env.items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                errors["env"].append(f"{str(key)[:40]!r} is not a valid variable name")
            elif not isinstance(value, str) or len(value) > 10_000 or "\x00" in value:
                errors["env"].append(f"{key}: the value must be text of at most 10000 characters")
    if spec.checkpoint_dir:
        team_dir = _team_dir(spec.team)
        wanted = PurePosixPath(posixpath.normpath(spec.checkpoint_dir))
        if (
            "\x00" in spec.checkpoint_dir
            or len(spec.checkpoint_dir) > 1024
            or not wanted.is_relative_to(team_dir)
            or wanted == team_dir
        ):
            errors["checkpoint_dir"].append(f"Must be inside your team's directory {team_dir}/")
    for text_field in ("name", "command", "gpu_type"):
        if "\x00" in getattr(spec, text_field):
            errors[text_field].append("Must not contain NUL characters")
    if errors:
        raise ValidationError({k: v for k, v in errors.items()})


def _pending_job_for(spec: JobSpec, *, job_id: str, now: datetime) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        team=spec.team.slug,
        tier=CoreTier(spec.tier),
        replicas=spec.replicas,
        gpus_per_replica=spec.gpus_per_replica,
        gpu_type=spec.gpu_type,
        submit_time=now.timestamp(),
        time_limit=float(spec.time_limit_s or _default_time_limit()),
        priority=spec.priority,
        locality=LeafLocality(spec.leaf_locality),
        cpus_per_replica=spec.cpus_per_replica or 0,
        memory_mb_per_replica=spec.memory_mb_per_replica or 0,
        one_fabric=spec.one_fabric,
        one_per_node=spec.one_per_node,
    )


def _admission(spec: JobSpec, *, now: datetime) -> Verdict:
    """The full check, for a preview a person reads: can it ever run, and where or when it would start."""
    return eta_admit(snapshot_build(now=now), _pending_job_for(spec, job_id="new", now=now), now=now.timestamp())


QUEUED = "queued: the scheduler places it at its next cycle, in a second or two"


def _admission_fast(spec: JobSpec, *, now: datetime, capacity: Capacity | None = None) -> Verdict:
    """The same accept-or-refuse verdict as _admission, without a snapshot or a plan per submission
    (scheduling/core/capacity.py; tests/property/test_capacity.py holds them equal): a CI pipeline
    submitting hundreds of jobs a second must not rebuild the cluster for each. Where and when an
    accepted job starts is the next cycle's word, written into its pending reason a moment later."""
    job = _pending_job_for(spec, job_id="new", now=now)
    why = refusal(capacity or cluster_capacity(), quota_chain(team=spec.team, gpu_type=spec.gpu_type), job)
    return Verdict(ok=False, reason=why) if why is not None else Verdict(ok=True, reason=QUEUED)


def job_preview(*, user: User, spec: JobSpec) -> Verdict:
    """Would this job be accepted, and where or when would it start? Raises ValidationError for bad fields."""
    spec = with_default_resources(spec)
    _validate_spec(user=user, spec=spec)
    return _admission(spec, now=timezone.now())


def _same_spec(job: Job, spec: JobSpec) -> bool:
    return (
        job.name == spec.name
        and job.team_id == spec.team.pk
        and job.tier == spec.tier
        and job.kind == spec.kind
        and job.replicas == spec.replicas
        and job.gpus_per_replica == spec.gpus_per_replica
        and job.gpu_type == spec.gpu_type
        and job.command == spec.command
        and job.env == dict(spec.env)
        and job.time_limit_s == (spec.time_limit_s or _default_time_limit())
        and (not spec.checkpoint_dir or job.checkpoint_dir == posixpath.normpath(spec.checkpoint_dir))
        and job.priority == spec.priority
        and job.leaf_locality == spec.leaf_locality
        and job.one_fabric == spec.one_fabric
        and job.one_per_node == spec.one_per_node
        and job.cpus_per_replica == spec.cpus_per_replica
        and job.memory_mb_per_replica == spec.memory_mb_per_replica
    )


def _existing_for_key(user: User, key: str, spec: JobSpec) -> Job | None:
    job = Job.objects.filter(user=user, idempotency_key=key).first()
    if job is not None and not _same_spec(job, spec):
        raise IdempotencyConflict(job)
    return job


def job_submit(*, user: User, spec: JobSpec, idempotency_key: str | None = None, copied_from: Job | None = None) -> Job:
    """Validate, run the admission check, create the PENDING job; the same key and spec twice -> the same job.

    Raises ValidationError (field -> messages; "__all__" when the admission check refuses) and
    IdempotencyConflict when the key was used for another spec.
    """
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 128):
        raise ValidationError({"idempotency_key": "Between 1 and 128 characters"})
    spec = with_default_resources(spec)
    if idempotency_key and (existing := _existing_for_key(user, idempotency_key, spec)) is not None:
        return existing
    capacity = cluster_capacity()  # read once for the fields' check and the admission check
    _validate_spec(user=user, spec=spec, capacity=capacity)
    now = timezone.now()
    verdict = _admission_fast(spec, now=now, capacity=capacity)
    if not verdict.ok:
        raise ValidationError({NON_FIELD_ERRORS: [f"{NEVER_RUNS}: {verdict.reason}"]})
    try:
        with transaction.atomic():
            job = _create_job(user=user, spec=spec, key=idempotency_key, copied_from=copied_from, now=now, verdict=verdict)
    except IntegrityError:
        # A concurrent retry with the same key won the race: answer with its job.
        if idempotency_key and (existing := _existing_for_key(user, idempotency_key, spec)) is not None:
            return existing
        raise
    cycle_request()
    return job


def _create_job(*, user: User, spec: JobSpec, key: str | None, copied_from: Job | None, now: datetime, verdict: Verdict) -> Job:
    job = Job.objects.create(
        name=spec.name,
        team=spec.team,
        user=user,
        tier=spec.tier,
        kind=spec.kind,
        replicas=spec.replicas,
        gpus_per_replica=spec.gpus_per_replica,
        gpu_type=spec.gpu_type,
        cpus_per_replica=resources_of(spec)[0],
        memory_mb_per_replica=resources_of(spec)[1],
        command=spec.command,
        env=dict(spec.env),
        time_limit_s=spec.time_limit_s or _default_time_limit(),
        priority=spec.priority,
        leaf_locality=spec.leaf_locality,
        one_fabric=spec.one_fabric,
        one_per_node=spec.one_per_node,
        submitted_at=now,
        state_changed_at=now,
        idempotency_key=key,
        copied_from=copied_from,
        pending_reason=verdict.reason,
    )
    job.checkpoint_dir = (
        posixpath.normpath(spec.checkpoint_dir) if spec.checkpoint_dir else str(_team_dir(spec.team) / str(job.pk))
    )
    Job.objects.filter(pk=job.pk).update(checkpoint_dir=job.checkpoint_dir)
    event = JobEvent.objects.create(
        job=job,
        time=now,
        attempt=1,
        to_state=JobState.PENDING,
        reason=f"submitted; {verdict.reason}",
        actor=user,
        actor_label=user.get_username(),
    )
    # A new job's one event, for a caller that shows the job without reading it back.
    job.submit_event = event  # type: ignore[attr-defined]
    audit(
        actor=user,
        action="job.submit",
        obj=job,
        unit=spec.team,
        message=f"{job.name}: {job.replicas}x{job.gpus_per_replica} {job.gpu_type}, tier {job.tier}",
        data={"copied_from": copied_from.pk if copied_from else None, "idempotency_key": key},
    )
    return job


# --------------------------------------------------------------------------- stop, cancel, requeue


def _stop_tasks(job: Job) -> None:
    """Every live rank of the attempt is told to stop; each one settles when its agent reports it exited.

    Ranks still ASSIGNED become STOPPING too (their agent may have started them without saying so
    yet). An agent never reports a rank it never started (docs/agent-api.md: "stop" for it is a
    no-op), so the agent API must settle such a rank when the agent's complete task list lacks it.
    """
    Task.objects.filter(job=job, attempt=job.attempt, state__in=(TaskState.ASSIGNED, TaskState.RUNNING)).update(
        state=TaskState.STOPPING
    )


@transaction.atomic
def job_request_stop(
    *,
    job: Job,
    reason: str,
    grace_s: float | None = None,
    actor: User | None = None,
    actor_label: str | None = None,
    note: str = "",
) -> Job:
    """Order a running gang to stop (SIGTERM, ``grace_s``, SIGKILL by its agents); the job settles when its tasks exit.

    ``note`` (optional) says why in the job's event, e.g. the scheduler's preemption reason.

    Conditional: a job already told to stop is returned unchanged (two reapers never stop it
    twice) — except that a cancel overrides a preemption in progress, so it ends CANCELLED.
    """
    if reason not in STOP_REASONS:
        raise ValueError(f"unknown stop reason {reason!r}; one of {', '.join(STOP_REASONS)}")
    now = timezone.now()
    grace = round(grace_s if grace_s is not None else yard_number("GRACE_PERIOD_S"))
    label = _label(actor, actor_label)
    ordered = Job.objects.filter(pk=job.pk, attempt=job.attempt, state__in=ACTIVE_STATES, stop_requested_at__isnull=True).update(
        stop_requested_at=now, stop_reason=reason, stop_grace_s=grace
    )
    if not ordered:
        if reason == "CANCELLED" and Job.objects.filter(
            pk=job.pk, attempt=job.attempt, stop_reason__in=("PREEMPTED", "NODE_LOST", "NODE_FAULT")
        ).update(stop_reason="CANCELLED"):
            job.refresh_from_db()
            _note(job, "cancelled while being stopped for a requeue: it will end cancelled", actor=actor, actor_label=label)
            return job
        job.refresh_from_db()
        return job
    job.refresh_from_db()
    text = f"stop ordered ({reason}, grace {grace} s)" + (f": {note}" if note else "")
    if reason == "PREEMPTED" and job.state != JobState.PREEMPTING:
        job_transition(job=job, to=JobState.PREEMPTING, reason=text, actor=actor, actor_label=label)
    else:
        _note(job, text, actor=actor, actor_label=label)
    _stop_tasks(job)
    return job


@transaction.atomic
def job_cancel(*, job: Job, actor: User) -> Job:
    """A pending job is cancelled at once; a running one is told to stop (it ends CANCELLED); a finished one is left."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state == JobState.PENDING:
        job_transition(job=job, to=JobState.CANCELLED, reason=f"cancelled by {actor.get_username()}", actor=actor)
        Job.objects.filter(pk=job.pk).update(pending_reason="", estimated_start=None, reservation_domain="")
    elif job.state in ACTIVE_STATES:
        job = job_request_stop(job=job, reason="CANCELLED", actor=actor)
    else:
        return job
    audit(actor=actor, action="job.cancel", obj=job, unit=job.team, message=f"cancel {job.name} ({job.state})")
    cycle_request()
    return job


@transaction.atomic
def job_requeue(*, job: Job, reason: str, actor_label: str) -> Job:
    """PREEMPTED or LOST -> PENDING as attempt + 1, with its checkpoint directory, so it resumes from it."""
    job = job_transition(
        job=job,
        to=JobState.PENDING,
        reason=f"requeued as attempt {job.attempt + 1}: {reason}",
        actor_label=actor_label,
        attempt=job.attempt + 1,
        started_at=None,
        ended_at=None,
        exit_code=None,
        stop_requested_at=None,
        stop_reason="",
        locality="",
        leaves_spanned=0,
        borrowed=False,
        pending_reason="requeued; waiting for the next scheduling cycle",
        estimated_start=None,
        reservation_domain="",
    )
    cycle_request()
    return job


# --------------------------------------------------------------------------- task reports


@transaction.atomic
def task_mark_running(*, task: Task, pid: int | None, started_at: datetime, notebook_url: str = "") -> Task:
    """ASSIGNED -> RUNNING; the job STARTING -> RUNNING once every rank of the attempt runs. Repeats change nothing."""
    job = Job.objects.select_for_update().get(pk=task.job_id)  # serialises the ranks' reports on one job
    changed = Task.objects.filter(pk=task.pk, state=TaskState.ASSIGNED).update(
        state=TaskState.RUNNING, pid=pid, started_at=started_at, notebook_url=notebook_url
    )
    task.refresh_from_db()
    if not changed or job.attempt != task.attempt or job.state != JobState.STARTING:
        return task
    waiting = Task.objects.filter(job=job, attempt=job.attempt).exclude(state=TaskState.RUNNING).exists()
    if not waiting:
        job_transition(job=job, to=JobState.RUNNING, reason=f"all {job.replicas} ranks running", actor_label="scheduler")
    return task


@dataclass(frozen=True)
class StartReport:
    """An agent's word that it started a task (in a heartbeat)."""

    pid: int | None
    started_at: datetime | None
    notebook_url: str = ""


def tasks_mark_started(*, tasks: list[Task], reports: Mapping[int, StartReport], now: datetime) -> list[Task]:
    """ASSIGNED -> RUNNING for every task in ``tasks`` that ``reports`` names; each job STARTING -> RUNNING
    once every rank of its attempt runs. In bulk, a fixed number of statements for any count: a node
    that starts eight ranks at once reports them in one heartbeat, and 4,000 jobs placed in one cycle
    start within a heartbeat interval. Returns the tasks that changed (updated in place).

    The jobs' rows are locked first, in id order, as task_mark_running and the stop services lock
    them: so no stop order slips between reading a task ASSIGNED and writing it RUNNING, and two nodes
    starting ranks of one gang at once see each other's ranks when they check the gang.
    """
    wanted = {t.pk: t for t in tasks if t.pk in reports and t.state == TaskState.ASSIGNED}
    if not wanted:
        return []  # the steady state: no transaction, no statement
    with transaction.atomic():
        return _tasks_mark_started(wanted, reports, now)


def _tasks_mark_started(wanted: dict[int, Task], reports: Mapping[int, StartReport], now: datetime) -> list[Task]:
    job_ids = sorted({t.job_id for t in wanted.values()})
    list(Job.objects.select_for_update().filter(pk__in=job_ids).order_by("pk").values_list("pk", flat=True))
    still = set(Task.objects.filter(pk__in=list(wanted), state=TaskState.ASSIGNED).values_list("pk", flat=True))
    changed = [wanted[pk] for pk in sorted(still)]
    if not changed:
        return []
    for task in changed:
        report = reports[task.pk]
        task.state, task.pid = TaskState.RUNNING, report.pid
        task.started_at = report.started_at or now
        task.notebook_url = report.notebook_url or task.notebook_url
    Task.objects.bulk_update(changed, ["state", "pid", "started_at", "notebook_url"])
    jobs = {j.pk: j for j in Job.objects.filter(pk__in={t.job_id for t in changed}, state=JobState.STARTING)}
    waiting = set(
        Task.objects.filter(job_id__in=list(jobs), attempt=F("job__attempt"))
        .exclude(state=TaskState.RUNNING)
        .values_list("job_id", flat=True)
    )
    ready = [job for pk, job in sorted(jobs.items()) if pk not in waiting]
    if ready:
        Job.objects.filter(pk__in=[j.pk for j in ready], state=JobState.STARTING, started_at__isnull=True).update(started_at=now)
        Job.objects.filter(pk__in=[j.pk for j in ready], state=JobState.STARTING).update(
            state=JobState.RUNNING, state_changed_at=now
        )
        JobEvent.objects.bulk_create(
            JobEvent(
                job=job,
                time=now,
                attempt=job.attempt,
                from_state=JobState.STARTING,
                to_state=JobState.RUNNING,
                reason=f"all {job.replicas} ranks running",
                actor_label="scheduler",
            )
            for job in ready
        )
    return changed


def _release(task_ids: list[int], now: datetime) -> None:
    Allocation.objects.filter(task_id__in=task_ids, released_at__isnull=True).update(released_at=now)


@transaction.atomic
def task_mark_exited(*, task: Task, exit_code: int | None, signal: int | None, stopped_by: str, ended_at: datetime) -> Task:
    """The task ended: release its GPUs; when the attempt's last task has ended, settle the job.

    A rank that fails while others run makes the others stop (a gang without one rank only hangs).
    """
    job = Job.objects.select_for_update().get(pk=task.job_id)
    now = timezone.now()
    changed = Task.objects.filter(pk=task.pk, state__in=TASK_LIVE_STATES).update(
        state=TaskState.EXITED, exit_code=exit_code, signal=signal, stopped_by=stopped_by or "", ended_at=ended_at
    )
    task.refresh_from_db()
    if not changed:
        return task
    _release([task.pk], now)
    if job.attempt != task.attempt or job.state not in ACTIVE_STATES:
        cycle_request()
        return task
    failed = exit_code != 0 or signal is not None
    if Task.objects.filter(job=job, attempt=job.attempt, state__in=TASK_LIVE_STATES).exists():
        if failed and job.stop_requested_at is None:
            job_request_stop(job=job, reason="RANK_FAILED", grace_s=30, actor_label="scheduler")
            _note(
                job,
                f"rank {task.rank} failed (exit {exit_code}, signal {signal}): stopping the other ranks",
                actor_label="scheduler",
            )
    else:
        _settle(job)
    cycle_request()
    return task


def _settle(job: Job) -> None:
    """The attempt's last task ended: the job's final state follows from its stop order and exit codes."""
    tasks = list(Task.objects.filter(job=job, attempt=job.attempt))
    clean = all(t.exit_code == 0 and t.signal is None and not t.stopped_by for t in tasks)
    first_bad = next((t.exit_code for t in tasks if t.exit_code not in (0, None)), None)
    exit_code = 0 if clean else (first_bad if first_bad is not None else -1)
    reason = job.stop_reason
    if reason == "NODE_LOST":
        job_transition(
            job=job, to=JobState.LOST, reason="a node of the gang was lost; every other rank stopped", actor_label="scheduler"
        )
        job_requeue(job=job, reason="a node of the gang was lost", actor_label="scheduler")
    elif reason == "NODE_FAULT":
        # A node of the gang could not start its rank (its disk was full): not the job's fault.
        why = "a node of the gang could not start its rank; every rank stopped"
        job_transition(job=job, to=JobState.LOST, reason=why, actor_label="scheduler")
        job_requeue(job=job, reason="a node of the gang could not start its rank", actor_label="scheduler")
    elif reason == "PREEMPTED" and not clean:
        job_transition(
            job=job, to=JobState.PREEMPTED, reason="preempted: every rank stopped", actor_label="scheduler", exit_code=exit_code
        )
        job_requeue(job=job, reason="preempted", actor_label="scheduler")
    elif reason in ("CANCELLED", "IDLE_TIMEOUT"):
        why = "cancelled" if reason == "CANCELLED" else "idle timeout: the notebook held GPUs unused"
        job_transition(job=job, to=JobState.CANCELLED, reason=why, actor_label="scheduler", exit_code=exit_code)
    elif reason == "TIME_LIMIT":
        job_transition(
            job=job,
            to=JobState.FAILED,
            reason=f"time limit of {job.time_limit_s} s reached",
            actor_label="scheduler",
            exit_code=exit_code,
        )
    elif clean:
        job_transition(job=job, to=JobState.COMPLETED, reason="every rank exited 0", actor_label="scheduler", exit_code=0)
    else:
        job_transition(
            job=job, to=JobState.FAILED, reason=f"a rank failed (exit {exit_code})", actor_label="scheduler", exit_code=exit_code
        )


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
