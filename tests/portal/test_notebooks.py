"""Notebooks: launch, follow, open (owner only), stop."""

from __future__ import annotations

import re
import time
from datetime import datetime, timedelta

from django.urls import reverse
from django.utils import timezone

from scheduling.governance.reaper import last_complete_window
from scheduling.models import Gpu, IdlePolicy, Job, JobKind, Task
from scheduling.states import JobState
from tests.factories import make_job
from tests.governance.helpers import running_job, telemetry

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


def test_launch_with_an_image_keeps_it_and_a_bad_one_is_said_on_the_form(client, cast):
    client.force_login(cast.ann)
    form = {"team": cast.org.team_a.pk, "gpu_type": "H100", "gpus": 1, "tier": 2}
    bad = client.post(reverse("notebooks"), {**form, "image": "nvcr.io/Bad/Name"})
    assert bad.status_code == 400 and "is not a repository name part" in bad.content.decode()
    assert not Job.objects.exists()
    client.post(reverse("notebooks"), {**form, "image": "jupyter/base-notebook:2024"})
    assert Job.objects.get().image == "docker.io/jupyter/base-notebook:2024"


def test_owner_sees_open_and_is_redirected_to_the_notebook_proxy_without_a_token(client, cast, settings):
    settings.YARD_NOTEBOOK_URL = "http://127.0.0.1:8001"
    job = _running_notebook(cast, cast.ann)
    client.force_login(cast.ann)
    page = client.get(reverse("notebook", args=[job.pk])).content.decode()
    assert "Open notebook" in page and "s3cret" not in page
    response = client.get(reverse("notebook-open", args=[job.pk]))
    assert response.status_code == 302 and response["Location"] == f"http://127.0.0.1:8001/notebooks/{job.pk}/lab/"


def test_by_default_the_notebook_opens_at_the_portals_own_address(client, cast, settings):
    settings.YARD_NOTEBOOK_URL = ""
    job = _running_notebook(cast, cast.ann)
    client.force_login(cast.ann)
    assert client.get(reverse("notebook-open", args=[job.pk]))["Location"] == f"/notebooks/{job.pk}/lab/"


def test_open_is_not_offered_before_the_server_answers(client, cast):
    job = _running_notebook(cast, cast.ann, answering=False)
    client.force_login(cast.ann)
    assert b"Open notebook" not in client.get(reverse("notebook", args=[job.pk])).content
    assert client.get(reverse("notebook-open", args=[job.pk]))["Location"] == reverse("notebook", args=[job.pk])


def test_the_team_lead_may_open_it_a_teammate_neither_sees_nor_opens_it(client, cast):
    from tests.factories import make_user

    job = _running_notebook(cast, cast.ann)
    client.force_login(cast.lea)
    assert b"Open notebook" in client.get(reverse("notebook", args=[job.pk])).content
    assert client.get(reverse("notebook-open", args=[job.pk])).status_code == 302
    client.force_login(make_user("amy", unit=cast.org.team_a))
    page = client.get(reverse("notebook", args=[job.pk])).content.decode()
    assert "Open notebook" not in page and "s3cret" not in page
    assert client.get(reverse("notebook-open", args=[job.pk])).status_code == 404


def test_a_stopped_notebook_opens_nothing(client, cast):
    job = _running_notebook(cast, cast.ann)
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    client.force_login(cast.ann)
    assert client.get(reverse("notebook-open", args=[job.pk]))["Location"] == reverse("notebook", args=[job.pk])


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


def _now_mid_minute():
    """Now, but not in the last two seconds of a minute: the view reads the clock again, and the
    idle run ends at the last complete minute, which must be the same one for the test and the view."""
    now = timezone.now()
    if now.second >= 58:
        time.sleep(60.2 - now.second - now.microsecond / 1e6)
        now = timezone.now()
    return now


def test_the_page_says_how_long_the_gpu_has_been_idle_and_when_the_reaper_stops_it(client, cast):
    now = _now_mid_minute()
    node = Gpu.objects.first().node
    job = running_job(team=cast.org.team_a, user=cast.ann, node=node, kind=JobKind.NOTEBOOK, start=now - timedelta(hours=1))
    Task.objects.filter(job=job).update(notebook_kernel_busy=False)
    # Ten idle minutes, ending with the last complete one.
    telemetry(job, start=last_complete_window(now) - timedelta(minutes=9), minutes=10, utilization=0.0)
    client.force_login(cast.ann)
    body = client.get(reverse("notebook", args=[job.pk])).content.decode()
    block = re.search(r'<div id="notebook-activity"[^>]*>(.*?)</div>', body, re.S)
    assert block is not None
    text = " ".join(re.sub(r"<[^>]+>", "", block.group(1)).split())
    stop_at = now.replace(second=0, microsecond=0) + timedelta(minutes=35)  # 45 min timeout, 10 idle
    assert text == (
        f"Kernel idle · GPU idle (≤ 1 %) for the last 10 min. The idle reaper stops it at {stop_at:%H:%M} "
        "(in 35 min) unless its GPUs are used."
    )
    assert f'data-countdown="{stop_at.isoformat()}"' in body  # the page counts down to that moment


def test_the_owner_can_extend_once_and_the_page_says_until_when(client, cast):
    now = _now_mid_minute()
    node = Gpu.objects.first().node
    job = running_job(team=cast.org.team_a, user=cast.ann, node=node, kind=JobKind.NOTEBOOK, start=now - timedelta(hours=1))
    telemetry(job, start=last_complete_window(now) - timedelta(minutes=39), minutes=40, utilization=0.0)
    client.force_login(cast.ann)
    page = reverse("notebook", args=[job.pk])
    assert "Keep it 60 min longer" in client.get(page).content.decode()
    response = client.post(reverse("notebook-extend-idle", args=[job.pk]), {"next": page})
    assert response.status_code == 302 and response["Location"] == page
    body = client.get(page).content.decode()
    assert "Extended by its owner until" in body and "Keep it 60 min longer" not in body


def test_a_teammate_is_not_offered_the_extension(client, cast):
    node = Gpu.objects.first().node
    job = running_job(
        team=cast.org.team_a, user=cast.ann, node=node, kind=JobKind.NOTEBOOK, start=_now_mid_minute() - timedelta(hours=1)
    )
    client.force_login(cast.lea)  # the team's lead may stop it, not extend it
    body = client.get(reverse("notebook", args=[job.pk])).content.decode()
    assert "Stop notebook" in body and "Keep it" not in body


def test_a_notebook_the_reaper_stopped_reads_stopped_not_cancelled(client, cast):
    job = make_job(
        team=cast.org.team_a, user=cast.ann, kind=JobKind.NOTEBOOK, state=JobState.CANCELLED, stop_reason="IDLE_TIMEOUT"
    )
    client.force_login(cast.ann)
    body = client.get(reverse("notebook", args=[job.pk])).content.decode()
    assert re.search(r'id="job-state">Stopped \(idle\)<', body) and "Stopped by the idle reaper" in body
    assert "Stopped (idle)" in client.get(reverse("notebooks")).content.decode()


def test_a_busy_kernel_and_gpu_say_so(client, cast):
    now = _now_mid_minute()
    node = Gpu.objects.first().node
    job = running_job(team=cast.org.team_a, user=cast.ann, node=node, kind=JobKind.NOTEBOOK, start=now - timedelta(hours=1))
    Task.objects.filter(job=job).update(notebook_kernel_busy=True)
    telemetry(job, start=last_complete_window(now) - timedelta(minutes=2), minutes=3, utilization=87.0)
    client.force_login(cast.ann)
    body = client.get(reverse("notebook", args=[job.pk])).content.decode()
    assert "Kernel busy · GPU busy in the last minute" in " ".join(body.split())


def test_a_finished_notebook_shows_no_activity(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, kind=JobKind.NOTEBOOK, state=JobState.CANCELLED)
    client.force_login(cast.ann)
    assert 'id="notebook-activity"' not in client.get(reverse("notebook", args=[job.pk])).content.decode()


def test_a_notebook_idle_past_its_timeout_without_a_warning_says_the_warnings_lead(client, cast):
    """The reaper warns first and stops only after the warning stood its whole lead, so a notebook idle
    for the whole timeout but not warned yet still has the lead to go: the words and the countdown agree."""
    now = _now_mid_minute()
    node = Gpu.objects.first().node
    job = running_job(team=cast.org.team_a, user=cast.ann, node=node, kind=JobKind.NOTEBOOK, start=now - timedelta(hours=2))
    Task.objects.filter(job=job).update(notebook_kernel_busy=False)
    telemetry(job, start=last_complete_window(now) - timedelta(minutes=59), minutes=60, utilization=0.0)
    client.force_login(cast.ann)
    body = client.get(reverse("notebook", args=[job.pk])).content.decode()
    text = " ".join(re.sub(r"<[^>]+>", "", body).split())
    lead_min = round(IdlePolicy().warn_lead_s / 60)  # the default policy's lead
    assert lead_min > 0
    assert f"(in {lead_min} min) unless its GPUs are used." in text, text
    countdown = re.search(r'data-countdown="([^"]+)"', body)
    assert countdown is not None
    stop_at = datetime.fromisoformat(countdown.group(1))
    assert abs((stop_at - now).total_seconds() - lead_min * 60) < 5
