"""Notebooks: launch, follow, open (owner only), stop."""

from __future__ import annotations

from django.urls import reverse

from scheduling.models import Gpu, Job, JobKind, Task
from scheduling.states import JobState
from tests.factories import make_job

HTMX = {"HTTP_HX_REQUEST": "true"}
URL = "http://127.0.0.1:8888/lab?token=s3cret"


def _running_notebook(cast, user, *, answering=True):
    job = make_job(team=cast.org.team_a, user=user, kind=JobKind.NOTEBOOK, state=JobState.RUNNING)
    node = Gpu.objects.first().node
    # The agent reports kernel_busy (true or false) only while the server answers its probe.
    busy = False if answering else None
    Task.objects.create(job=job, attempt=1, rank=0, node=node, state="RUNNING", notebook_url=URL, notebook_kernel_busy=busy)
    return job


def test_launch_creates_a_pending_notebook_and_shows_its_page(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("notebooks"), {"team": cast.org.team_a.pk, "gpu_type": "H100", "gpus": 1, "tier": 2})
    job = Job.objects.get()
    assert (job.kind, job.state, job.gpus_per_replica) == (JobKind.NOTEBOOK, JobState.PENDING, 1)
    assert response["Location"] == reverse("notebook", args=[job.pk])


def test_owner_sees_open_and_is_redirected_to_the_server_with_its_token(client, cast):
    job = _running_notebook(cast, cast.ann)
    client.force_login(cast.ann)
    assert b"Open notebook" in client.get(reverse("notebook", args=[job.pk])).content
    response = client.get(reverse("notebook-open", args=[job.pk]))
    assert response.status_code == 302 and response["Location"] == URL


def test_open_is_not_offered_before_the_server_answers(client, cast):
    job = _running_notebook(cast, cast.ann, answering=False)
    client.force_login(cast.ann)
    assert b"Open notebook" not in client.get(reverse("notebook", args=[job.pk])).content
    assert client.get(reverse("notebook-open", args=[job.pk]))["Location"] == reverse("notebook", args=[job.pk])


def test_teammate_neither_sees_nor_opens_the_notebook(client, cast):
    job = _running_notebook(cast, cast.ann)
    client.force_login(cast.lea)
    page = client.get(reverse("notebook", args=[job.pk])).content.decode()
    assert "Open notebook" not in page and "s3cret" not in page
    assert client.get(reverse("notebook-open", args=[job.pk])).status_code == 404


def test_other_tenant_gets_404_for_the_notebook_page(client, cast):
    job = _running_notebook(cast, cast.ann)
    client.force_login(cast.zed)
    assert client.get(reverse("notebook", args=[job.pk])).status_code == 404


def test_open_before_it_runs_goes_back_to_the_page(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, kind=JobKind.NOTEBOOK)
    client.force_login(cast.ann)
    assert client.get(reverse("notebook-open", args=[job.pk]))["Location"] == reverse("notebook", args=[job.pk])


def test_pending_notebook_page_polls_and_a_stopped_one_stops_polling(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, kind=JobKind.NOTEBOOK)
    client.force_login(cast.ann)
    assert client.get(reverse("notebook", args=[job.pk]), **HTMX).status_code == 200
    client.post(reverse("notebook-stop", args=[job.pk]))
    assert client.get(reverse("notebook", args=[job.pk]), **HTMX).status_code == 286


def test_batch_job_is_not_a_notebook(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client.force_login(cast.ann)
    assert client.get(reverse("notebook", args=[job.pk])).status_code == 404
