"""Reads of one job and its tasks, with the tenant check built in, and its tasks' logs.

Views and tasks never filter jobs by tenant themselves: they call ``jobs_visible`` /
``access_job*``, so none can forget the check. Apart from the cluster's reads (the snapshot, usage):
these are what a person's request reads, job by job.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.db.models import Q, QuerySet
from django.http import Http404

from scheduling.models import Job, Task
from tenants.selectors import AnyUser, is_cluster_admin, teams_led, units_visible


def jobs_visible(*, user: AnyUser) -> QuerySet[Job]:
    """Jobs the user may read: their teams' (members, leads), their subtree's (org admins), all (cluster admins)."""
    if not user.is_authenticated:
        return Job.objects.none()
    if is_cluster_admin(user):
        return Job.objects.all()
    return Job.objects.filter(Q(team__in=units_visible(user=user)) | Q(user=user))


def access_job(*, user: AnyUser, pk: int | str) -> Job:
    """The job with ``pk`` if the user may read it; the same 404 as a missing one otherwise."""
    try:
        return jobs_visible(user=user).select_related("team", "user").get(pk=int(pk))
    except (Job.DoesNotExist, ValueError, TypeError, OverflowError):
        raise Http404("No such job") from None


def can_manage_job(*, user: AnyUser, job: Job) -> bool:
    """Owner, the team's lead, an org admin above the team, a cluster admin."""
    if not user.is_authenticated:
        return False
    if job.user_id == user.pk or is_cluster_admin(user):
        return True
    return teams_led(user=user).filter(pk=job.team_id).exists()


def access_job_manage(*, user: AnyUser, pk: int | str) -> Job:
    """The job if the user may act on it: 404 if they cannot see it, PermissionDenied if they only can see it."""
    job = access_job(user=user, pk=pk)
    if not can_manage_job(user=user, job=job):
        raise PermissionDenied("Only the job's owner, its team's lead or an admin above the team may do this")
    return job


def job_tasks(*, job: Job) -> list[Task]:
    """Tasks of the job's current attempt, rank order, with their nodes."""
    return list(job.tasks.filter(attempt=job.attempt).select_related("node__leaf").order_by("rank"))


# --------------------------------------------------------------------------- logs

LOG_READ_MAX_BYTES = 1024 * 1024


def task_log_read(*, task: Task, offset: int, max_bytes: int = LOG_READ_MAX_BYTES) -> tuple[str, int]:
    """The task's log from byte ``offset`` (UTF-8 bytes of the agent's stream), at most ``max_bytes``; and the next offset.

    Follow a log by calling again with the returned offset: it equals ``offset`` while nothing new came.
    """
    first = task.log_chunks.filter(offset__lte=offset).order_by("-offset").values_list("offset", flat=True).first()
    chunks = task.log_chunks.filter(offset__gte=first if first is not None else offset).order_by("offset")
    parts: list[bytes] = []
    size = 0
    position = offset
    for chunk_offset, data in chunks.values_list("offset", "data").iterator(chunk_size=100):
        raw = data.encode("utf-8")
        if chunk_offset + len(raw) <= position:
            continue
        piece = raw[max(position - chunk_offset, 0) :]
        if chunk_offset > position:  # a hole (a lost chunk): skip to what we have
            position = chunk_offset
        piece = piece[: max_bytes - size]
        parts.append(piece)
        size += len(piece)
        position += len(piece)
        if size >= max_bytes:
            break
    return b"".join(parts).decode("utf-8", errors="replace"), max(position, offset)


def task_log_tail(*, task: Task, lines: int) -> tuple[str, int]:
    """The last ``lines`` lines of the task's log, and the offset to follow on from."""
    collected: list[str] = []
    end = 0
    newlines = 0
    for chunk_offset, data in task.log_chunks.order_by("-offset").values_list("offset", "data").iterator(chunk_size=50):
        end = max(end, chunk_offset + len(data.encode("utf-8")))
        collected.append(data)
        newlines += data.count("\n")
        if newlines > lines or sum(len(c) for c in collected) > LOG_READ_MAX_BYTES:
            break
    text = "".join(reversed(collected))
    kept = text.splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept), end
