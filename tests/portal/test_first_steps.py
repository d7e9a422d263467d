"""What a new user trips over, each fixed: the preview before typing, the GPU type a team has, hours in
hours, a saved template kept on screen, no stale cancel banner, a 404 page in DEBUG, a favicon, ETAs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduling.core.eta import with_estimates
from scheduling.core.plan import plan
from scheduling.models import Allocation, Gpu, Job, JobTemplate, Task
from scheduling.selectors import snapshot_build
from scheduling.states import JobState
from tenants.services import quota_set
from tests.factories import make_job

HTMX = {"HTTP_HX_REQUEST": "true"}


def test_the_preview_before_anything_is_typed_complains_of_nothing(client, cast):
    client.force_login(cast.ann)
    page = client.get(reverse("job-submit")).content.decode()
    assert 'hx-trigger="change, input' in page  # an empty form is not checked on load
    assert "Fill in the form to see whether and when the job would start" in page
    data = {"name": "", "team": cast.org.team_a.pk, "tier": 2, "replicas": 1, "gpus_per_replica": 1, "gpu_type": "H100",
            "command": "python train.py"}  # fmt: skip
    body = client.post(reverse("job-submit") + "?preview=1", data, **HTMX).content.decode()
    assert "required" not in body and 'data-ok="true"' in body  # no name yet is no reason to complain


def test_a_copied_job_is_checked_as_soon_as_its_form_opens(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, name="old-run")
    client.force_login(cast.ann)
    assert 'hx-trigger="load, change' in client.get(reverse("job-submit"), {"from": job.pk}).content.decode()


def test_the_gpu_type_defaults_to_one_the_team_has_quota_for(client, cast):
    quota_set(actor=None, unit=cast.org.team_c, gpu_type="A100", guaranteed=0, limit=8)  # A100 sorts first
    client.force_login(cast.ann)  # team-a: H100 only
    assert client.get(reverse("job-submit")).context["form"]["gpu_type"].value() == "H100"
    assert client.get(reverse("notebooks")).context["form"]["gpu_type"].value() == "H100"


def test_saving_a_template_keeps_the_form_filled(client, cast):
    client.force_login(cast.ann)
    data = {"name": "nightly", "team": cast.org.team_a.pk, "tier": 2, "replicas": 2, "gpus_per_replica": 4,
            "gpu_type": "H100", "command": "python eval.py", "env": "", "time_limit_h": "3", "checkpoint_dir": ""}  # fmt: skip
    response = client.post(reverse("job-submit"), {**data, "save_template": "1", "title": "nightly eval"})
    template = JobTemplate.objects.get()
    assert response["Location"] == f"{reverse('job-submit')}?template={template.pk}"
    form = client.get(response["Location"]).context["form"]
    assert (form["name"].value(), form["replicas"].value(), form["time_limit_h"].value()) == ("nightly", 2, 3.0)


def test_the_time_limit_entered_in_hours_is_shown_in_hours(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, time_limit_s=3600)
    client.force_login(cast.ann)
    body = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "<dd>1 h</dd>" in body and "3600 s" not in body


def test_cancelling_leaves_no_banner_to_linger_after_the_job_ended(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client.force_login(cast.ann)
    client.post(reverse("job-cancel", args=[job.pk]))
    body = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "being cancelled" not in body and 'id="job-state">Cancelled<' in body


def test_a_job_of_another_team_is_a_plain_404_page_even_in_debug(client, cast, settings):
    settings.DEBUG = True
    job = make_job(team=cast.org.team_c, user=cast.zed, name="secret-run")
    client.force_login(cast.ann)
    response = client.get(reverse("job", args=[job.pk]))
    body = response.content.decode()
    assert response.status_code == 404 and 'id="not-found"' in body
    assert "secret-run" not in body and "URLconf" not in body and "DEBUG = True" not in body
    unknown = client.get("/no/such/page/")
    assert unknown.status_code == 404 and 'id="not-found"' in unknown.content.decode()
    assert client.get(f"/api/v1/jobs/{job.pk}").json()  # the API keeps its JSON errors


def test_every_page_has_a_favicon(client, cast):
    client.force_login(cast.ann)
    assert 'rel="icon" href="/static/yard/favicon.svg"' in client.get(reverse("dashboard")).content.decode()


def test_a_pending_job_that_fits_says_it_is_starting_not_waiting(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, pending_reason="fits now on leaf-1 (node h100-01, NVLink domain intact)")
    client.force_login(cast.ann)
    body = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "<strong>Starting:</strong>" in body and "Waiting: fits now" not in body


@pytest.mark.parametrize("key", ["id", "name"])
def test_a_quota_wait_gets_an_eta_from_the_running_jobs_time_limit_and_the_page_shows_it(client, cast, key):
    # team-a may hold 32 H100 (its limit) and holds 32 in a job that ends within an hour at the latest.
    started = timezone.now() - timedelta(minutes=30)
    running = make_job(team=cast.org.team_a, user=cast.lea, state=JobState.RUNNING, replicas=4, gpus_per_replica=8,
                       started_at=started, time_limit_s=3600)  # fmt: skip
    for rank, node in enumerate({g.node for g in Gpu.objects.select_related("node")}):
        task = Task.objects.create(job=running, attempt=1, rank=rank, node=node, state="RUNNING")
        Allocation.objects.bulk_create(Allocation(gpu=g, task=task, job=running, attempt=1) for g in node.gpus.all())
    waiting = make_job(team=cast.org.team_a, user=cast.ann, gpus_per_replica=8)
    now = timezone.now()
    snapshot = snapshot_build(now=now)
    result = with_estimates(snapshot, plan(snapshot, now=now.timestamp()), now=now.timestamp())
    key_of_waiting = str(waiting.pk)
    assert result.estimated_start[key_of_waiting] == pytest.approx((started + timedelta(hours=1)).timestamp())
    assert result.pending_reasons[key_of_waiting].endswith(f"frees up when job {running.name} (#{running.pk}) ends")
    # What the cycle writes (the lead wires with_estimates in), the page shows, with names for ids.
    reason = result.pending_reasons[key_of_waiting]
    if key == "id":
        reason = reason.replace("team-a", str(cast.org.team_a.pk))  # a row written while the core named units by id
    Job.objects.filter(pk=waiting.pk).update(pending_reason=reason, estimated_start=started + timedelta(hours=1))
    client.force_login(cast.ann)
    body = " ".join(client.get(reverse("job", args=[waiting.pk])).content.decode().split())
    assert "<strong>Waiting:</strong> over team team-a quota" in body or "<strong>Waiting:</strong> over team" in body
    assert f"over team {cast.org.team_a.pk} " not in body
    assert "Estimated start:" in body and "at the earliest" in body
