"""Job arrays in the portal: the submit form's Array field, the job list's one row per array (its tasks per
state) that opens over htmx to its tasks, and an array's tasks listed alone."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scheduling.models import Job, JobArray, JobTemplate
from scheduling.services import JobSpec, job_array_submit
from scheduling.states import JobState
from tests.factories import make_job
from tests.portal.test_jobs import HTMX, _submit_data

pytestmark = pytest.mark.django_db


def _array(cast, text: str, *, user=None, name: str = "sweep") -> JobArray:
    spec = JobSpec(name=name, team=cast.org.team_a, command="python eval.py")
    return job_array_submit(user=user or cast.ann, spec=spec, array=text).array


def test_the_submit_form_with_an_array_makes_one_job_per_index(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast, replicas=1, gpus_per_replica=1, array="0-4%2"))
    array = JobArray.objects.get()
    assert response.status_code == 302 and response["Location"] == f"{reverse('jobs')}?array={array.pk}"
    tasks = Job.objects.filter(array=array).order_by("array_index")
    assert [t.array_index for t in tasks] == [0, 1, 2, 3, 4]
    assert tasks[3].env["YARD_ARRAY_TASK_ID"] == "3" and tasks[3].env["EPOCHS"] == "3"
    assert array.max_running == 2


def test_without_an_array_the_form_makes_one_job(client, cast):
    client.force_login(cast.ann)
    client.post(reverse("job-submit"), _submit_data(cast))
    assert Job.objects.count() == 1 and not JobArray.objects.exists()


def test_a_bad_array_is_said_on_its_field(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast, array="5-1"))
    assert response.status_code == 400
    assert "give 1-5" in response.context["form"].errors["array"][0]
    assert not Job.objects.exists()


def test_the_preview_says_the_verdict_is_each_tasks(client, cast):
    client.force_login(cast.ann)
    body = client.post(
        reverse("job-submit") + "?preview=1", _submit_data(cast, replicas=1, gpus_per_replica=1, array="0-9"), **HTMX
    ).content.decode()
    assert "Each of its 10 tasks" in body


def test_a_template_keeps_the_array(client, cast):
    client.force_login(cast.ann)
    client.post(reverse("job-submit"), {**_submit_data(cast, array="0-3%1"), "save_template": "1", "title": "sweep"})
    assert JobTemplate.objects.get(name="sweep").spec["array"] == "0-3%1"


def test_the_list_shows_an_array_as_one_row_with_its_tasks_per_state(client, cast):
    array = _array(cast, "0-9")
    Job.objects.filter(array=array, array_index__in=[1, 2]).update(state=JobState.COMPLETED)
    make_job(team=cast.org.team_a, user=cast.ann, name="solo")
    client.force_login(cast.ann)
    body = client.get(reverse("jobs")).content.decode()
    assert body.count('class="job-array"') == 1
    assert f"array #{array.pk} sweep" in body and "[0-9]" in body
    assert "8 pending" in body and "2 completed" in body
    assert "solo" in body
    assert "[7]</span>" not in body  # its tasks wait to be opened
    assert "2 jobs" in body  # two rows: the array and the solo job


def test_an_array_row_opens_over_htmx_to_its_tasks_and_closes_again(client, cast):
    array = _array(cast, "3-5")
    client.force_login(cast.ann)
    url = reverse("job-array-rows", args=[array.pk])
    opened = client.get(url, {"open": "1"}, **HTMX).content.decode()
    assert opened.startswith(f'<tbody id="array-{array.pk}"')
    for job in Job.objects.filter(array=array):
        assert f"#{job.pk} sweep</a>" in opened and f"[{job.array_index}]</span>" in opened
    assert "Hide tasks" in opened
    closed = client.get(url, {"open": "0"}, **HTMX).content.decode()
    assert "Show tasks" in closed and "[4]</span>" not in closed


def test_a_large_array_opens_to_its_first_tasks_and_links_to_all(client, cast):
    array = _array(cast, "0-119")
    client.force_login(cast.ann)
    opened = client.get(reverse("job-array-rows", args=[array.pk]), {"open": "1"}, **HTMX).content.decode()
    assert "[49]</span>" in opened and "[50]</span>" not in opened
    assert "The first 50 of 120 tasks" in opened and f"?array={array.pk}" in opened


def test_an_arrays_tasks_are_listed_alone_with_the_filters(client, cast):
    array = _array(cast, "0-5")
    Job.objects.filter(array=array, array_index=4).update(state=JobState.FAILED)
    client.force_login(cast.ann)
    body = client.get(reverse("jobs"), {"array": array.pk, "state": "FAILED"}).content.decode()
    assert "[4]</span>" in body and "[3]</span>" not in body
    assert f"The tasks of array #{array.pk} [0-5]" in body


def test_a_state_filter_shows_an_array_with_a_task_in_that_state(client, cast):
    array = _array(cast, "0-3")
    client.force_login(cast.ann)
    assert f"array #{array.pk}" not in client.get(reverse("jobs"), {"state": "RUNNING"}).content.decode()
    Job.objects.filter(array=array, array_index=2).update(state=JobState.RUNNING)
    assert f"array #{array.pk}" in client.get(reverse("jobs"), {"state": "RUNNING"}).content.decode()


def test_another_tenants_array_rows_are_404(client, cast):
    array = _array(cast, "0-3")
    client.force_login(cast.zed)
    assert client.get(reverse("job-array-rows", args=[array.pk]), {"open": "1"}).status_code == 404


def test_the_list_reads_the_same_number_of_queries_for_one_array_and_five(client, cast):
    client.force_login(cast.ann)
    counts = []
    for batch in (1, 4):
        for _ in range(batch):
            _array(cast, "0-9")
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(reverse("jobs")).status_code == 200
        counts.append(len(ctx))
    assert counts[0] == counts[1]


def test_a_tasks_page_says_which_array_and_index_it_is(client, cast):
    array = _array(cast, "3-5")
    task = Job.objects.get(array=array, array_index=4)
    client.force_login(cast.ann)
    body = client.get(reverse("job", args=[task.pk])).content.decode()
    assert f'index 4 of <a href="{reverse("jobs")}?array={array.pk}">array #{array.pk}</a>' in body
