"""A job after submission: stop, cancel and requeue, the agents' task reports (started, exited), and
how a gang's last rank settles the job."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from scheduling.models import Allocation, Job, JobEvent, Task
from scheduling.selectors import yard_number
from scheduling.services.common import (
    STOP_REASONS,
    _label,
    _note,
    cycle_request,
    job_transition,
)
from scheduling.states import ACTIVE_STATES, TASK_LIVE_STATES, JobState, TaskState
from tenants.services import audit

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
        stop_message="",
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
    elif reason == "IMAGE_PULL":
        # Not requeued: the registry would answer the next attempt as it answered this one.
        why = job.stop_message or "a node could not pull the job's image"
        job_transition(job=job, to=JobState.FAILED, reason=why, actor_label="scheduler", exit_code=exit_code)
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
