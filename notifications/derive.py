"""What each recorded row means to people: JobEvent and AuditEntry rows, and running jobs near their limit.

Nothing here is told about events by the scheduler: the scheduling cycle, the agents' reports and the
reaper record JobEvents as they always have, and this reads them afterwards. Classification is by the
transition (to_state) and, for the idle reaper's notes, by the reaper's label and the start of its text
(scheduling/governance/reaper.py: "idle warning: …", "… stopping the notebook" or "… stopping the dev session").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count

from notifications.kinds import Kind
from scheduling.governance.reaper import REAPER_LABEL, STOP_NOTES
from scheduling.models import Job, JobEvent, JobKind
from scheduling.states import ACTIVE_STATES, JobState
from tenants.models import AuditEntry, OrgUnit
from tenants.services import quota_change_words


@dataclass(frozen=True)
class EventSpec:
    key: str
    kind: str
    time: datetime
    title: str
    body: str
    link: str
    job: Job | None = None
    team: OrgUnit | None = None
    data: dict[str, Any] = field(default_factory=dict)


# What a job of each kind is called, and where its page is (a kind not listed: "Job", /jobs/<id>/).
_NAMES: dict[str, str] = {JobKind.NOTEBOOK: "Notebook", JobKind.DEV: "Dev session"}
_PAGES: dict[str, str] = {JobKind.NOTEBOOK: "notebooks", JobKind.DEV: "dev-sessions"}


def _what(job: Job) -> str:
    return f"{_NAMES.get(job.kind, 'Job')} #{job.pk} {job.name}"


def _link(job: Job) -> str:
    return f"/{_PAGES.get(job.kind, 'jobs')}/{job.pk}/"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def from_job_event(row: JobEvent) -> EventSpec | None:
    """The notification a JobEvent row makes, or None (most rows: submitted, placed, stop ordered, …)."""
    job = row.job
    data: dict[str, Any] = {
        "job": job.pk,
        "attempt": row.attempt,
        "from": row.from_state,
        "to": row.to_state,
        "reason": row.reason,
    }
    what = _what(job)

    def spec(kind: str, title: str, body: str) -> EventSpec:
        return EventSpec(
            key=f"jobevent:{row.pk}", kind=kind, time=row.time, title=title, body=body, link=_link(job), job=job, team=job.team,
            data=data,
        )  # fmt: skip

    if job.array_id is not None and row.to_state in _ARRAY_NOTICES:
        return _array_event(row, job)
    if row.to_state == JobState.RUNNING:
        body = f"Attempt {row.attempt} is running on {job.replicas} × {job.gpus_per_replica} {job.gpu_type} ({row.reason})."
        return spec(Kind.JOB_STARTED, f"{what} started", body)
    if row.to_state == JobState.COMPLETED:
        said = row.reason.strip().rstrip(".")
        body = "Every rank exited 0." if said.lower() in ("", "every rank exited 0") else f"Every rank exited 0 ({said})."
        return spec(Kind.JOB_COMPLETED, f"{what} completed", body)
    if row.to_state == JobState.FAILED:
        code = job.exit_code
        data["exit_code"] = code
        title = f"{what} failed" + (f" (exit code {code})" if code is not None else "")
        return spec(Kind.JOB_FAILED, title, f"Attempt {row.attempt}: {row.reason}.")
    if row.to_state == JobState.PREEMPTED:
        body = (
            f"Attempt {row.attempt} was preempted to make room for higher-priority or in-quota work ({row.reason}); "
            f"it is requeued as attempt {row.attempt + 1} and resumes from its checkpoint directory."
        )
        return spec(Kind.JOB_PREEMPTED, f"{what} preempted and requeued", body)
    if row.from_state == JobState.LOST and row.to_state == JobState.PENDING:
        return spec(Kind.JOB_REQUEUED, f"{what} requeued: its node was lost", row.reason)
    if not row.to_state and row.actor_label == REAPER_LABEL:
        if row.reason.startswith("idle warning:"):
            body = _sentence(row.reason.removeprefix("idle warning:")) + " Use the GPUs or extend it on its page."
            return spec(Kind.IDLE_WARNING, f"{what} is idle and will be stopped", body)
        if row.reason.endswith(STOP_NOTES):
            return spec(Kind.IDLE_STOPPED, f"{what} stopped: idle", _sentence(row.reason))
    return None


# A job array's tasks say when the array starts and when it is over, as Slurm's mail does for an array
# (BEGIN, END, FAIL apply to the array as a whole): not one notice per task, which for 4,000 tasks is
# 8,000 mails. A task's preemption or requeue is still its own notice.
_ARRAY_NOTICES = frozenset({JobState.RUNNING, JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED})


def _array_event(row: JobEvent, job: Job) -> EventSpec | None:
    """The array's start (its first task running) or its end (its last task over); None for the rest. The
    key is the array's, so the one notice is made once however many tasks' rows ask for it."""
    array_id = job.array_id
    tasks = Job.objects.filter(array_id=array_id)
    link = f"/jobs/?array={array_id}"
    data: dict[str, Any] = {"array": array_id, "job": job.pk, "index": job.array_index}
    name = f"Array #{array_id} {job.name}"
    if row.to_state == JobState.RUNNING:
        body = f"Task {job.array_index} (job #{job.pk}) is the first of its tasks to run; the next notice comes when all end."
        return EventSpec(
            key=f"array-start:{array_id}", kind=Kind.JOB_STARTED, time=row.time, title=f"{name} started", body=body,
            link=link, job=job, team=job.team, data=data,
        )  # fmt: skip
    if tasks.filter(state__in=ACTIVE_STATES).exists():
        return None
    counts = {state: n for state, n in tasks.values_list("state").annotate(n=Count("pk")).values_list("state", "n")}
    done, failed, cancelled = (counts.get(s, 0) for s in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED))
    total = sum(counts.values())
    data.update(completed=done, failed=failed, cancelled=cancelled)
    parts = [f"{done} completed"] + [f"{n} {word}" for n, word in ((failed, "failed"), (cancelled, "cancelled")) if n]
    title = f"{name}: {', '.join(parts)} of {total} tasks"
    body = f"All {total} tasks have ended: {', '.join(parts)}."
    if failed:
        body += " The failed ones are listed on the array's page."
    return EventSpec(
        key=f"array-end:{array_id}", kind=Kind.JOB_FAILED if failed else Kind.JOB_COMPLETED, time=row.time, title=title,
        body=body, link=link, job=job, team=job.team, data=data,
    )  # fmt: skip


def _quota_message(row: AuditEntry) -> str:
    """The change in words from the row's before and after (rows written before the message said only the
    changed fields read the same), else the message as written."""
    data = row.data if isinstance(row.data, dict) else {}
    before, after = data.get("before"), data.get("after")
    if not isinstance(before, dict) or not isinstance(after, dict) or row.unit is None:
        return row.message
    words = quota_change_words(before, after, created=row.action == "quota.create")
    return f"{row.unit.name} {data.get('gpu_type', '')}: {words}"


def _sentence(text: str) -> str:
    """``text`` as a sentence: its first letter upper case and the rest as written ("GPUs" stays
    "GPUs", which str.capitalize() would make "gpus"), and one full stop."""
    text = text.strip().rstrip(".")
    return (text[:1].upper() + text[1:] + ".") if text else ""


SERVICE_KINDS = {"service.crash_loop": Kind.SERVICE_CRASH_LOOP, "service.rolled_back": Kind.SERVICE_ROLLED_BACK}


def _service_event(row: AuditEntry) -> EventSpec | None:
    """A service's replica crash-looping, or its rollout rolled back (the service controller's audit rows)."""
    data = row.data if isinstance(row.data, dict) else {}
    if not isinstance(data.get("service"), int):
        return None
    name = row.message.split(":", 1)[0]
    if row.action == "service.crash_loop":
        title = f"Service {name}: a replica is crash-looping"
    else:
        title = f"Service {name}: rollout rolled back"
    return EventSpec(
        key=f"audit:{row.pk}",
        kind=SERVICE_KINDS[row.action],
        time=row.time,
        title=title,
        body=_sentence(row.message.split(":", 1)[-1]),
        link=f"/services/{data['service']}/",
        team=row.unit,
        data={"audit": row.pk, "action": row.action, **data},
    )


def from_audit_entry(row: AuditEntry) -> EventSpec | None:
    """Quota changes (actions quota.*) of a unit: they affect every team at or under it. A service's
    crash-looping replica or rolled-back rollout: its owner and its team's leads hear of it."""
    if row.action in SERVICE_KINDS:
        return _service_event(row)
    if not row.action.startswith("quota.") or row.unit is None:
        return None
    return EventSpec(
        key=f"audit:{row.pk}",
        kind=Kind.QUOTA_CHANGED,
        time=row.time,
        title=f"Quota of {row.unit.name} changed",
        body=f"{_quota_message(row)} (by {row.actor_label}).",
        link="/quotas/",
        team=row.unit,
        data={"audit": row.pk, "action": row.action, "unit": row.unit.slug, **row.data},
    )


def near_limit(job: Job, *, now: datetime, lead_s: float) -> EventSpec | None:
    """A running attempt that ends by its time limit within ``lead_s``: once per attempt (the key).

    A job whose whole limit is shorter than the lead gets no warning: it was "near" from its start.
    """
    if job.started_at is None or job.time_limit_s <= lead_s:
        return None
    deadline = job.started_at + timedelta(seconds=job.time_limit_s)
    if not deadline - timedelta(seconds=lead_s) <= now < deadline:
        return None
    left = (deadline - now).total_seconds()
    body = (
        f"Attempt {job.attempt} reaches its time limit of {_hours(job.time_limit_s)} at {deadline:%Y-%m-%d %H:%M} UTC, "
        f"in about {_hours(left)}; it is then stopped. Save a checkpoint before then."
    )
    return EventSpec(
        key=f"near-limit:{job.pk}:{job.attempt}",
        kind=Kind.JOB_NEAR_LIMIT,
        time=now,
        title=f"{_what(job)} ends at its time limit in about {_hours(left)}",
        body=body,
        link=_link(job),
        job=job,
        team=job.team,
        data={"job": job.pk, "attempt": job.attempt, "deadline": deadline.isoformat()},
    )
