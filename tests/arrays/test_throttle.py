"""An array's %N enforced by the real scheduling cycle (run_cycle_once over PostgreSQL): at most N of its
tasks hold GPUs at once, the lowest indices first, the rest say "JobArrayTaskLimit", and when one ends
the next starts."""

from __future__ import annotations

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Task
from scheduling.services import (
    JobSpec,
    job_array_cancel,
    job_array_submit,
    job_request_stop,
    job_submit,
    task_mark_exited,
    task_mark_running,
)
from scheduling.states import ACTIVE_STATES, JobState
from tests.factories import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def ann(cast):
    return cast.ann


def _array(cast, array: str, **kw):
    spec = JobSpec(name="sweep", team=cast.org.team_a, command="python eval.py", gpus_per_replica=1, **kw)
    return job_array_submit(user=cast.ann, spec=spec, array=array).array


def _active(array) -> list[int]:
    return sorted(Job.objects.filter(array=array, state__in=ACTIVE_STATES).values_list("array_index", flat=True))


def _finish(job: Job, exit_code: int = 0) -> None:
    for task in Task.objects.filter(job=job, attempt=job.attempt):
        task_mark_running(task=task, pid=1, started_at=timezone.now())
        task_mark_exited(
            task=Task.objects.get(pk=task.pk), exit_code=exit_code, signal=None, stopped_by="", ended_at=timezone.now()
        )


def test_with_a_limit_of_two_only_two_run_and_the_next_starts_when_one_ends(cast, nodes):
    array = _array(cast, "0-5%2")
    run_cycle_once()
    assert _active(array) == [0, 1]
    held = Job.objects.get(array=array, array_index=4)
    assert held.state == JobState.PENDING
    assert held.pending_reason.startswith(f"JobArrayTaskLimit: array {array.pk} runs at most 2")
    run_cycle_once()  # a second cycle places nothing more: the two still hold their GPUs
    assert _active(array) == [0, 1]
    _finish(Job.objects.get(array=array, array_index=0))
    assert Job.objects.get(array=array, array_index=0).state == JobState.COMPLETED
    run_cycle_once()
    assert _active(array) == [1, 2]
    _finish(Job.objects.get(array=array, array_index=1), exit_code=3)
    _finish(Job.objects.get(array=array, array_index=2))
    run_cycle_once()
    assert _active(array) == [3, 4]
    assert Job.objects.get(array=array, array_index=1).state == JobState.FAILED  # each task ends on its own


def test_without_a_limit_every_task_that_fits_starts(cast, nodes):
    array = _array(cast, "0-5")
    run_cycle_once()
    assert _active(array) == [0, 1, 2, 3, 4, 5]


def test_the_limit_holds_only_its_own_array(cast, nodes):
    array = _array(cast, "0-5%1")
    other = job_submit(user=cast.ann, spec=JobSpec(name="solo", team=cast.org.team_a, command="true"))
    run_cycle_once()
    assert _active(array) == [0]
    assert Job.objects.get(pk=other.pk).state in ACTIVE_STATES


def test_a_cancelled_running_task_frees_its_place_once_it_has_ended(cast, nodes):
    array = _array(cast, "0-3%1")
    run_cycle_once()
    first = Job.objects.get(array=array, array_index=0)
    assert first.state in ACTIVE_STATES
    job_array_cancel(array=array, actor=cast.ann)
    assert set(Job.objects.filter(array=array).exclude(pk=first.pk).values_list("state", flat=True)) == {JobState.CANCELLED}
    first.refresh_from_db()
    assert first.stop_reason == "CANCELLED"
    run_cycle_once()
    assert _active(array) == [0]  # nothing pending is left to start


def test_another_teams_member_is_not_held_by_the_array(cast, nodes):
    _array(cast, "0-9%1")
    cid = make_user("cid", unit=cast.org.team_b)
    solo = job_submit(user=cid, spec=JobSpec(name="solo", team=cast.org.team_b, command="true"))
    run_cycle_once()
    assert Job.objects.get(pk=solo.pk).state in ACTIVE_STATES


def test_a_preempted_task_is_requeued_as_itself_and_goes_first_within_the_limit(cast, nodes):
    array = _array(cast, "0-3%1")
    run_cycle_once()
    first = Job.objects.get(array=array, array_index=0)
    task = Task.objects.get(job=first, attempt=1)
    task_mark_running(task=task, pid=1, started_at=timezone.now())
    job_request_stop(job=Job.objects.get(pk=first.pk), reason="PREEMPTED", grace_s=0, actor_label="scheduler")
    task_mark_exited(task=Task.objects.get(pk=task.pk), exit_code=None, signal=15, stopped_by="sigterm", ended_at=timezone.now())
    first.refresh_from_db()
    assert (first.state, first.attempt, first.array_index) == (JobState.PENDING, 2, 0)
    run_cycle_once()
    assert _active(array) == [0]  # the requeued task again, not index 1: lowest first, still one at a time
    assert Job.objects.get(pk=first.pk).attempt == 2
    assert Job.objects.get(array=array, array_index=1).pending_reason.startswith("JobArrayTaskLimit")


def test_raising_the_limit_over_the_api_starts_more_at_the_next_cycle_and_lowering_it_starts_none(cast, nodes):
    from tests.api.conftest import token_client

    array = _array(cast, "0-5%1")
    run_cycle_once()
    assert _active(array) == [0]
    client = token_client(cast.ann_token)
    response = client.patch(f"/api/v1/arrays/{array.pk}", {"max_running": 3}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["array"] == "0-5%3"
    run_cycle_once()
    assert _active(array) == [0, 1, 2]
    assert Job.objects.get(array=array, array_index=4).pending_reason.startswith(
        f"JobArrayTaskLimit: array {array.pk} runs at most 3"
    )
    assert client.patch(f"/api/v1/arrays/{array.pk}", {"max_running": 1}, format="json").status_code == 200
    _finish(Job.objects.get(array=array, array_index=0))
    run_cycle_once()
    assert _active(array) == [1, 2]  # none stopped, none started while two still run
    assert client.patch(f"/api/v1/arrays/{array.pk}", {"max_running": None}, format="json").status_code == 200
    run_cycle_once()
    assert _active(array) == [1, 2, 3, 4, 5]
    assert client.patch(f"/api/v1/arrays/{array.pk}", {"max_running": 0}, format="json").status_code == 400
    unchanged = client.patch(f"/api/v1/arrays/{array.pk}", {}, format="json")
    assert unchanged.status_code == 200 and unchanged.json()["max_running"] is None
    other = token_client(cast.bea_token).patch(f"/api/v1/arrays/{array.pk}", {"max_running": 9}, format="json")
    assert other.status_code == 404


def test_the_snapshots_filter_and_the_reasons_agree_on_which_tasks_are_held(cast, nodes):
    from scheduling.selectors import array_tasks_held, pending_jobs

    capped = _array(cast, "0-9%3")
    _array(cast, "0-4")  # no limit: nothing held
    one = _array(cast, "5-8%1")
    Job.objects.filter(array=capped, array_index__in=[0, 4]).update(state=JobState.RUNNING)
    Job.objects.filter(array=capped, array_index=1).update(state=JobState.COMPLETED)
    Job.objects.filter(array=one, array_index=5).update(state=JobState.PREEMPTING)
    held = {pk for _, ids in array_tasks_held().values() for pk in ids}
    pending = set(Job.objects.filter(state=JobState.PENDING).values_list("pk", flat=True))
    assert set(pending_jobs().values_list("pk", flat=True)) == pending - held
    # capped: 2 of 3 places taken, so index 2 may start and 3, 5-9 wait; one: its one place is taken
    assert sorted(Job.objects.filter(pk__in=held, array=capped).values_list("array_index", flat=True)) == [3, 5, 6, 7, 8, 9]
    assert sorted(Job.objects.filter(pk__in=held, array=one).values_list("array_index", flat=True)) == [6, 7, 8]
