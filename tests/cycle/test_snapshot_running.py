"""The snapshot's running jobs (``selectors.snapshot._running``): read as one row per job with its GPUs,
compared with the last snapshot's rows as wholes. Each job's GPUs by rank are what its live allocations
say; an unchanged job is the same object from one snapshot to the next, an unchanged set the same tuple;
a job that ends, starts, is told to stop, or whose team is renamed reads anew."""

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Allocation, Job
from scheduling.selectors import snapshot_build
from scheduling.services import JobSpec, job_submit
from scheduling.states import ACTIVE_STATES, JobState
from tenants.models import OrgUnit

pytestmark = pytest.mark.django_db


def _reference() -> dict[str, tuple[tuple[str, ...], ...]]:
    """Each active job's live GPUs by rank, through the ORM."""
    ranks: dict[str, dict[int, list[str]]] = {}
    live = Allocation.objects.filter(released_at__isnull=True, job__state__in=ACTIVE_STATES)
    for a in live.select_related("task").order_by("job_id", "task__rank", "gpu_id"):
        ranks.setdefault(str(a.job_id), {}).setdefault(a.task.rank, []).append(str(a.gpu_id))
    return {job_id: tuple(tuple(gpus) for _, gpus in sorted(by_rank.items())) for job_id, by_rank in ranks.items()}


def _running():
    return snapshot_build(now=timezone.now()).running


def test_running_jobs_read_by_row_change_only_where_their_rows_do(org, ann, nodes):
    gang = job_submit(user=ann, spec=JobSpec(name="gang", team=org.team_a, command="true", replicas=2, gpus_per_replica=4))
    small = [
        job_submit(user=ann, spec=JobSpec(name=f"s{i}", team=org.team_a, command="true", gpus_per_replica=2)) for i in range(3)
    ]
    run_cycle_once()
    first = _running()
    assert {j.job_id: j.replicas for j in first} == _reference()
    assert [j.job_id for j in first] == sorted((j.job_id for j in first), key=int)
    assert len(dict(zip((j.job_id for j in first), first, strict=True))[str(gang.pk)].replicas) == 2
    assert _running() is first  # nothing changed: the same tuple, which the core's caches compare by identity

    # One job ends, one is told to stop.
    ended, stopping = small[0], small[1]
    Job.objects.filter(pk=ended.pk).update(state=JobState.COMPLETED, ended_at=timezone.now())
    Allocation.objects.filter(job_id=ended.pk).update(released_at=timezone.now())
    Job.objects.filter(pk=stopping.pk).update(stop_requested_at=timezone.now())
    second = _running()
    before = {j.job_id: j for j in first}
    after = {j.job_id: j for j in second}
    assert str(ended.pk) not in after and after.keys() == _reference().keys()
    assert after[str(stopping.pk)].terminating and not before[str(stopping.pk)].terminating
    for job_id in after.keys() - {str(stopping.pk)}:
        assert after[job_id] is before[job_id]  # unchanged rows: the same objects

    # A renamed team: every job of it reads anew, with the new name.
    OrgUnit.objects.filter(pk=org.team_a.pk).update(slug="renamed-team")
    third = _running()
    assert {j.team for j in third} == {"renamed-team"}
    assert {j.job_id: j.replicas for j in third} == _reference()
