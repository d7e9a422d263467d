"""Job arrays' limit on tasks running at once (Slurm's ``--array=0-999%50``): which pending tasks wait for it.

Apart from the snapshot because it is one rule with one reason: the cycle leaves these tasks out of the
pending jobs it hands the core (so the core never places more than the limit), and writes their pending
reason itself, as Slurm's "JobArrayTaskLimit".
"""

from __future__ import annotations

from collections import defaultdict

from django.db.models import Count, QuerySet
from django.db.models.expressions import RawSQL
from django.http import Http404

from scheduling.models import Job, JobArray
from scheduling.selectors.jobs import access_job, access_job_manage
from scheduling.states import ACTIVE_STATES, JobState
from tenants.selectors import AnyUser


def array_limit_reason(*, array_id: int, max_running: int) -> str:
    return (
        f"JobArrayTaskLimit: array {array_id} runs at most {max_running} of its tasks at once (%{max_running}); "
        "this one starts when one of them ends"
    )


def _held_sql() -> str:
    """The ids array_tasks_held names, as one query the database answers (window functions: PostgreSQL and
    SQLite alike), for the snapshot to leave out without the ids travelling to Python and back."""
    job, array = Job._meta, JobArray._meta
    active = ", ".join(f"'{state}'" for state in sorted(ACTIVE_STATES))
    return (
        f"SELECT w.id FROM (SELECT j.id, j.array_id, a.max_running, "
        f"ROW_NUMBER() OVER (PARTITION BY j.array_id ORDER BY j.array_index) AS pos "
        f"FROM {job.db_table} j JOIN {array.db_table} a ON a.id = j.array_id "
        f"WHERE j.state = '{JobState.PENDING}' AND a.max_running IS NOT NULL) w "
        f"LEFT JOIN (SELECT array_id, COUNT(*) AS n FROM {job.db_table} WHERE array_id IS NOT NULL "
        f"AND state IN ({active}) GROUP BY array_id) r ON r.array_id = w.array_id "
        f"WHERE w.pos > w.max_running - COALESCE(r.n, 0)"
    )


def pending_placeable() -> QuerySet[Job]:
    """The pending jobs less the array tasks their arrays' limits hold back (array_tasks_held, in SQL)."""
    return Job.objects.filter(state=JobState.PENDING).exclude(pk__in=RawSQL(_held_sql(), ()))


def array_tasks_held() -> dict[int, tuple[int, list[int]]]:
    """Array id -> (its limit, its pending tasks held back): those beyond its limit less its tasks holding
    GPUs now, the highest indices held (the lowest go first, as in Slurm). Arrays without a limit hold
    nothing, and a queue without limited arrays costs one indexed read."""
    pending = (
        Job.objects.filter(state=JobState.PENDING, array__max_running__isnull=False)
        .order_by("array_id", "array_index")
        .values_list("pk", "array_id", "array__max_running")
    )
    waiting: dict[int, list[int]] = defaultdict(list)
    limits: dict[int, int] = {}
    for pk, array_id, limit in pending:
        if array_id is not None and limit is not None:  # both are: the filter above
            waiting[array_id].append(pk)
            limits[array_id] = limit
    if not waiting:
        return {}
    active = dict(
        Job.objects.filter(array_id__in=list(waiting), state__in=ACTIVE_STATES)
        .values_list("array_id")
        .annotate(n=Count("pk"))
        .values_list("array_id", "n")
    )
    held: dict[int, tuple[int, list[int]]] = {}
    for array_id, ids in waiting.items():
        room = max(0, limits[array_id] - active.get(array_id, 0))
        if len(ids) > room:
            held[array_id] = (limits[array_id], ids[room:])
    return held


def access_array(*, user: AnyUser, pk: int | str, manage: bool = False) -> JobArray:
    """The array with ``pk`` (its first task's job id) if the user may read it (``manage``: cancel it); the
    same 404 as a missing one otherwise. Its tasks share its team and owner, so its first task decides."""
    head = (access_job_manage if manage else access_job)(user=user, pk=pk)
    if head.array_id != head.pk:
        raise Http404("No such job array")
    return JobArray.objects.get(pk=head.pk)


def array_state_counts(array_ids: list[int]) -> dict[int, dict[str, int]]:
    """Array id -> its tasks per state (only the states it has), in one grouped read."""
    counts: dict[int, dict[str, int]] = defaultdict(dict)
    rows = Job.objects.filter(array_id__in=array_ids).values_list("array_id", "state").annotate(n=Count("pk"))
    for array_id, state, n in rows.values_list("array_id", "state", "n"):
        counts[array_id][state] = n
    return dict(counts)
