"""The portal's job form names an image, its mounts and working directory; the job page shows them, and a failed pull."""

from __future__ import annotations

from django.urls import reverse

from scheduling.models import Job
from scheduling.states import JobState
from tests.factories import make_job
from tests.portal.test_jobs import _submit_data

NGC = "nvcr.io/nvidia/pytorch:24.05-py3"


def test_the_form_submits_a_job_in_an_image(client, cast):
    client.force_login(cast.ann)
    data = _submit_data(cast, image=NGC, container_mounts="/data:/data:ro,/scratch", container_workdir="/workspace")
    response = client.post(reverse("job-submit"), data)
    job = Job.objects.get()
    assert response.status_code == 302, response.content.decode()[:2000]
    assert (job.image, job.container_workdir) == (NGC, "/workspace")
    assert job.container_mounts == [
        {"source": "/data", "target": "/data", "readonly": True},
        {"source": "/scratch", "target": "/scratch", "readonly": False},
    ]
    page = client.get(reverse("job", args=[job.pk])).content.decode()
    assert NGC in page and "/data → /data (read-only)" in page and "/workspace" in page


def test_copy_and_edit_fills_the_image_fields(client, cast):
    job = make_job(
        team=cast.org.team_a,
        user=cast.ann,
        image=NGC,
        container_mounts=[{"source": "/data", "target": "/d", "readonly": True}],
        container_workdir="/ws",
    )
    client.force_login(cast.ann)
    page = client.get(reverse("job-submit") + f"?from={job.pk}").content.decode()
    assert f'value="{NGC}"' in page and 'value="/data:/d:ro"' in page and 'value="/ws"' in page


def test_a_bad_mount_is_shown_next_to_its_field(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast, image=NGC, container_mounts="data:/data"))
    assert response.status_code == 400
    assert "must be an absolute path" in response.content.decode()
    assert not Job.objects.exists()


def test_an_image_off_the_allow_list_is_refused_on_the_form(client, cast, settings):
    settings.YARD = {**settings.YARD, "REGISTRY_ALLOW": ("nvcr.io",)}
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast, image="ghcr.io/me/x:1"))
    assert response.status_code == 400
    assert "the registries allowed are nvcr.io" in response.content.decode()


def test_the_page_of_a_job_whose_pull_failed_says_why(client, cast):
    message = "node n1: image pull failed: nvcr.io/x:1: the registry refused the credentials"
    job = make_job(team=cast.org.team_a, user=cast.ann, image="nvcr.io/x:1", state=JobState.FAILED)
    Job.objects.filter(pk=job.pk).update(stop_reason="IMAGE_PULL", stop_message=message)
    client.force_login(cast.ann)
    page = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "Its image could not be pulled:" in page and message in page


def test_a_host_jobs_page_says_it_has_no_image(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client.force_login(cast.ann)
    page = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "none: on the nodes' own environment" in page and "pull-failed" not in page
