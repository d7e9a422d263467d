"""Jobs list, job page, submit with preview, cancel and run again: tenants, query counts, CSRF."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scheduling.models import Allocation, Gpu, Job, JobEvent, JobTemplate, Task, TaskLogChunk
from scheduling.states import JobState
from tests.factories import make_job

HTMX = {"HTTP_HX_REQUEST": "true"}


def _submit_data(cast, **changes):
    data = {
        "name": "resnet",
        "team": cast.org.team_a.pk,
        "tier": 2,
        "replicas": 2,
        "gpus_per_replica": 4,
        "gpu_type": "H100",
        "command": "python train.py",
        "env": "EPOCHS=3\nLR=0.1",
        "time_limit_h": "2",
        "checkpoint_dir": "",
    }
    data.update(changes)
    return data


def _running_job(cast, *, user=None, replicas=2, gpus=2):
    job = make_job(team=cast.org.team_a, user=user or cast.ann, state=JobState.RUNNING, replicas=replicas, gpus_per_replica=gpus)
    free = list(Gpu.objects.order_by("node__name", "index"))
    for rank in range(replicas):
        node_gpus = [g for g in free if g.node.name == free[rank * 8].node.name][:gpus]
        task = Task.objects.create(job=job, attempt=1, rank=rank, node=node_gpus[0].node, state="RUNNING")
        for gpu in node_gpus:
            Allocation.objects.create(gpu=gpu, task=task, job=job, attempt=1)
        TaskLogChunk.objects.create(task=task, offset=0, data=f"rank {rank} says hello\n")
    return job


# --------------------------------------------------------------------------- list


def test_jobs_list_shows_mine_by_default(client, cast):
    make_job(team=cast.org.team_a, user=cast.ann, name="anns-job")
    make_job(team=cast.org.team_a, user=cast.lea, name="leas-job")
    client.force_login(cast.ann)
    body = client.get(reverse("jobs")).content.decode()
    assert "anns-job" in body and "leas-job" not in body


def test_jobs_list_team_scope_shows_teammates_jobs_but_not_other_tenants(client, cast):
    make_job(team=cast.org.team_a, user=cast.lea, name="leas-job")
    make_job(team=cast.org.team_c, user=cast.zed, name="zeds-job")
    client.force_login(cast.ann)
    body = client.get(reverse("jobs"), {"scope": "team"}).content.decode()
    assert "leas-job" in body and "zeds-job" not in body


def test_jobs_list_all_scope_is_refused_to_members(client, cast):
    make_job(team=cast.org.team_c, user=cast.zed, name="zeds-job")
    client.force_login(cast.ann)
    response = client.get(reverse("jobs"), {"scope": "all"})
    assert response.context["params"]["scope"] == "team"
    assert b"zeds-job" not in response.content


def test_jobs_list_filters_by_state_and_keeps_filters_in_page_links(client, cast):
    for i in range(30):
        make_job(team=cast.org.team_a, user=cast.ann, name=f"run-{i}", state=JobState.FAILED if i % 2 else JobState.PENDING)
    client.force_login(cast.ann)
    response = client.get(reverse("jobs"), {"state": "FAILED", "sort": "name"})
    assert {j.state for j in response.context["page"].object_list} == {"FAILED"}
    assert response.context["page"].paginator.count == 15
    assert "state=FAILED" in response.context["query"] and "sort=name" in response.context["query"]


def test_jobs_list_htmx_request_gets_only_the_results_fragment(client, cast):
    client.force_login(cast.ann)
    body = client.get(reverse("jobs"), **HTMX).content.decode()
    assert 'id="results"' in body and "<html" not in body


@pytest.mark.parametrize("scope", ["mine", "team", "all"])
def test_jobs_list_query_count_is_the_same_for_10_and_60_jobs(client, cast, scope):
    client.force_login(cast.oli)
    counts = []
    for batch in (10, 50):
        for i in range(batch):
            make_job(team=cast.org.team_a if i % 2 else cast.org.team_b, user=cast.oli, name=f"j{i}")
        with CaptureQueriesContext(connection) as ctx:
            assert client.get(reverse("jobs"), {"scope": scope}).status_code == 200
        counts.append(len(ctx))
    assert counts[0] == counts[1]


# --------------------------------------------------------------------------- job page


def test_job_page_shows_placement_ranks_and_log(client, cast):
    job = _running_job(cast)
    client.force_login(cast.ann)
    body = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "2 of 2 ranks running" in body
    assert "NVLink domain intact" in body
    assert "rank 0 says hello" in body


def test_job_page_of_another_tenant_is_404(client, cast):
    job = make_job(team=cast.org.team_c, user=cast.zed)
    client.force_login(cast.ann)
    assert client.get(reverse("job", args=[job.pk])).status_code == 404


def test_job_page_of_a_team_b_job_is_404_for_a_team_a_member(client, cast):
    job = make_job(team=cast.org.team_b, user=cast.ben)
    client.force_login(cast.ann)
    assert client.get(reverse("job", args=[job.pk])).status_code == 404


def test_job_page_poll_of_a_finished_job_stops_polling(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, state=JobState.COMPLETED)
    client.force_login(cast.ann)
    response = client.get(reverse("job", args=[job.pk]), **HTMX)
    assert response.status_code == 286
    assert b"hx-trigger" not in response.content


def test_job_page_poll_of_a_running_job_keeps_polling(client, cast):
    job = _running_job(cast)
    client.force_login(cast.ann)
    response = client.get(reverse("job", args=[job.pk]), **HTMX)
    assert response.status_code == 200 and b'hx-trigger="every 2s, refresh"' in response.content


def test_job_page_shows_the_pending_reason(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, pending_reason="needs 4 free nodes under one leaf switch")
    client.force_login(cast.ann)
    assert b"needs 4 free nodes under one leaf switch" in client.get(reverse("job", args=[job.pk])).content


def test_job_page_query_count_does_not_grow_with_events(client, cast):
    job = _running_job(cast)
    client.force_login(cast.ann)
    counts = []
    for n in (2, 40):
        JobEvent.objects.bulk_create(JobEvent(job=job, reason=f"note {i}") for i in range(n))
        with CaptureQueriesContext(connection) as ctx:
            client.get(reverse("job", args=[job.pk]))
        counts.append(len(ctx))
    assert counts[0] == counts[1]


# --------------------------------------------------------------------------- cancel and run again


def test_owner_cancels_a_pending_job(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client.force_login(cast.ann)
    response = client.post(reverse("job-cancel", args=[job.pk]))
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED


def test_teammate_cannot_cancel_someone_elses_job(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.lea)
    other = make_job(team=cast.org.team_a, user=cast.ann)
    client.force_login(cast.ann)
    assert client.post(reverse("job-cancel", args=[job.pk])).status_code == 403
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING
    assert other.state == JobState.PENDING


def test_team_lead_cancels_a_members_job(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client.force_login(cast.lea)
    client.post(reverse("job-cancel", args=[job.pk]))
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_cancel_of_another_tenants_job_is_404(client, cast):
    job = make_job(team=cast.org.team_c, user=cast.zed)
    client.force_login(cast.ann)
    assert client.post(reverse("job-cancel", args=[job.pk])).status_code == 404


def test_cancel_by_get_is_refused(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client.force_login(cast.ann)
    assert client.get(reverse("job-cancel", args=[job.pk])).status_code == 405


def test_htmx_cancel_without_csrf_token_is_refused(cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.ann)
    response = client.post(reverse("job-cancel", args=[job.pk]), **HTMX)
    assert response.status_code == 403
    assert Job.objects.get(pk=job.pk).state == JobState.PENDING


def test_htmx_cancel_with_the_csrf_header_works(cast):
    job = make_job(team=cast.org.team_a, user=cast.ann)
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.ann)
    client.get(reverse("job", args=[job.pk]))
    token = client.cookies["csrftoken"].value
    response = client.post(reverse("job-cancel", args=[job.pk]), HTTP_X_CSRFTOKEN=token, **HTMX)
    assert response.status_code == 200 and response["HX-Redirect"] == reverse("job", args=[job.pk])
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED


def test_run_again_submits_a_copy_of_a_finished_job(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, state=JobState.FAILED, name="flaky", env={"A": "1"})
    client.force_login(cast.ann)
    response = client.post(reverse("job-rerun", args=[job.pk]))
    copy = Job.objects.exclude(pk=job.pk).get()
    assert response["Location"] == reverse("job", args=[copy.pk])
    assert (copy.name, copy.env, copy.copied_from_id, copy.state) == ("flaky", {"A": "1"}, job.pk, JobState.PENDING)


def test_run_again_of_another_tenants_job_is_404(client, cast):
    job = make_job(team=cast.org.team_c, user=cast.zed, state=JobState.FAILED)
    client.force_login(cast.ann)
    assert client.post(reverse("job-rerun", args=[job.pk])).status_code == 404


# --------------------------------------------------------------------------- submit


def test_submit_creates_the_job_and_goes_to_its_page(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast))
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("job", args=[job.pk])
    assert (job.replicas, job.gpus_per_replica, job.env, job.time_limit_s) == (2, 4, {"EPOCHS": "3", "LR": "0.1"}, 7200)


def test_submit_keeps_the_leaf_locality_chosen_and_run_again_keeps_it_too(client, cast):
    client.force_login(cast.ann)
    client.post(reverse("job-submit"), _submit_data(cast, leaf_locality="required"))
    job = Job.objects.get()
    assert job.leaf_locality == "required"
    client.post(reverse("job-rerun", args=[job.pk]))
    assert Job.objects.exclude(pk=job.pk).get().leaf_locality == "required"
    client.post(reverse("job-submit"), _submit_data(cast, name="plain"))
    assert Job.objects.get(name="plain").leaf_locality == "auto"


def test_submit_keeps_cores_and_memory_given_and_fills_the_defaults_per_gpu_when_left_empty(client, cast):
    client.force_login(cast.ann)
    client.post(reverse("job-submit"), _submit_data(cast, name="sized", cpus_per_replica="12", memory_gb_per_replica="24"))
    client.post(reverse("job-submit"), _submit_data(cast, name="plain"))
    sized, plain = Job.objects.get(name="sized"), Job.objects.get(name="plain")
    assert (sized.cpus_per_replica, sized.memory_mb_per_replica) == (12, 24 * 1024)
    assert (plain.cpus_per_replica, plain.memory_mb_per_replica) == (8 * 4, 4 * 64 * 1024)  # 4 GPUs per replica
    page = client.get(reverse("job-submit") + f"?copy={sized.pk}").content.decode()
    assert 'name="cpus_per_replica"' in page and "Empty: 8 per GPU" in page
    bad = client.post(reverse("job-submit"), _submit_data(cast, name="bad", cpus_per_replica="0"))
    assert bad.status_code == 400 and not Job.objects.filter(name="bad").exists()


def test_submit_shows_a_bad_environment_line_next_to_its_field(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast, env="EPOCHS 3"))
    assert response.status_code == 400
    assert "Line 1: write KEY=VALUE" in response.content.decode()
    assert not Job.objects.exists()


def test_submit_for_another_tenants_team_is_refused(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast, team=cast.org.team_c.pk))
    assert response.status_code == 400 and not Job.objects.exists()


def test_submit_of_a_job_that_can_never_run_says_so(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit"), _submit_data(cast, replicas=64, gpus_per_replica=8))
    assert response.status_code == 400
    assert "can never run" in response.content.decode()


def test_preview_fragment_gives_the_admission_verdict(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("job-submit") + "?preview=1", _submit_data(cast), **HTMX)
    body = response.content.decode()
    assert response.status_code == 200 and 'data-ok="true"' in body and "<html" not in body
    assert not Job.objects.exists()


def test_preview_of_an_impossible_job_says_it_can_never_run(client, cast):
    client.force_login(cast.ann)
    body = client.post(reverse("job-submit") + "?preview=1", _submit_data(cast, replicas=64, gpus_per_replica=8), **HTMX)
    assert 'data-ok="false"' in body.content.decode()


def test_copy_and_edit_prefills_the_form_from_a_past_job(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, name="old-run", env={"SEED": "7"}, replicas=3)
    client.force_login(cast.ann)
    form = client.get(reverse("job-submit"), {"from": job.pk}).context["form"]
    assert (form.initial["name"], form.initial["env"], form.initial["replicas"]) == ("old-run", "SEED=7", 3)


def test_copy_and_edit_of_another_tenants_job_is_404(client, cast):
    job = make_job(team=cast.org.team_c, user=cast.zed)
    client.force_login(cast.ann)
    assert client.get(reverse("job-submit"), {"from": job.pk}).status_code == 404


def test_save_as_template_then_start_from_it(client, cast):
    client.force_login(cast.ann)
    client.post(reverse("job-submit"), {**_submit_data(cast, name="nightly"), "save_template": "1", "title": "nightly eval"})
    template = JobTemplate.objects.get(user=cast.ann)
    form = client.get(reverse("job-submit"), {"template": template.pk}).context["form"]
    assert form.initial["name"] == "nightly" and not Job.objects.exists()


def test_another_users_template_is_404(client, cast):
    client.force_login(cast.lea)
    client.post(reverse("job-submit"), {**_submit_data(cast), "save_template": "1", "title": "leas"})
    template = JobTemplate.objects.get()
    client.force_login(cast.ann)
    assert client.get(reverse("job-submit"), {"template": template.pk}).status_code == 404
