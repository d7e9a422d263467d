"""Who may open a running notebook, and the Jupyter server behind it: what the notebook pages and the
notebook proxy (portal/notebook_proxy.py) both ask, kept apart from either so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass

from django.http import Http404

from scheduling.models import Job, JobKind, Task
from scheduling.notebook_secrets import open_url
from scheduling.selectors import access_job, can_manage_job
from scheduling.states import JobState, TaskState


def server_url(job: Job) -> str:
    """The Jupyter server's URL with its token, once the agent's probe of the server got an answer; else "".

    The agent reports the URL as soon as it starts the server, and ``notebook_kernel_busy`` (true or
    false) only while the server answers its probe: offering the link before then would open a refused
    connection.
    """
    task = (
        Task.objects.filter(job=job, attempt=job.attempt, state=TaskState.RUNNING, notebook_kernel_busy__isnull=False)
        .exclude(notebook_url="")
        .only("notebook_url")
        .first()
    )
    return task.notebook_url if task else ""


def can_open_notebook(*, user: object, job: Job) -> bool:
    """Its owner, its team's lead, an admin above the team (the people who may stop it); nobody else, not
    even a teammate: a notebook is its owner's files and kernels."""
    return can_manage_job(user=user, job=job)  # type: ignore[arg-type]


@dataclass(frozen=True)
class NotebookTarget:
    base: str  # http://node:port/notebooks/42/lab/
    token: str | None


def notebook_target(*, user: object, pk: int) -> NotebookTarget | None:
    """The Jupyter server behind notebook ``pk`` if ``user`` may open it and it runs and answers; else None.

    What the notebook proxy asks before it forwards a request (with the token, opened from its seal)."""
    try:
        job = access_job(user=user, pk=pk)  # type: ignore[arg-type]
    except Http404:
        return None
    if job.kind != JobKind.NOTEBOOK or job.state != JobState.RUNNING or not can_open_notebook(user=user, job=job):
        return None
    stored = server_url(job)
    if not stored:
        return None
    server = open_url(stored)
    return NotebookTarget(base=server.base, token=server.token)
