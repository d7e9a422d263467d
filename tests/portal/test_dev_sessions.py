"""Dev sessions (docs/dev-sessions.md): launched, listed, followed, stopped through the API and the pages;
the ssh object; the idle reaper treats them exactly as notebooks."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from notifications.derive import from_job_event
from notifications.kinds import Kind
from scheduling.cycle import run_cycle_once
from scheduling.governance.reaper import REAPER_LABEL, idle_warnings_for, last_complete_window, reap_idle_notebooks
from scheduling.models import Gpu, Job, JobEvent, JobKind, Node, Task
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState, TaskState
from tenants.services import quota_set, ssh_key_add, token_create_personal
from tests.factories import make_job
from tests.governance.helpers import MINUTE, running_job, telemetry

HTMX = {"HTTP_HX_REQUEST": "true"}
HOST_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJeydCn38sbRTRwmOmdrcmDOENk2ojY+o9EBHo+Chbsn"
ED25519 = HOST_KEY + " ann@laptop"
T0 = datetime(2026, 11, 10, 9, 0, tzinfo=UTC)


def _api(user) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_create_personal(user=user, name='t', expires_at=None).raw}")
    return client


def _node():
    return Gpu.objects.order_by("pk").first().node


def _running_session(cast, user=None, *, endpoint="10.0.0.5:20001", connections=1, start=None):
    """A RUNNING dev session holding one GPU, whose agent reported its sshd."""
    job = running_job(
        team=cast.org.team_a,
        user=user or cast.ann,
        node=_node(),
        kind=JobKind.DEV,
        start=start or timezone.now() - timedelta(hours=1),
    )
    Task.objects.filter(job=job).update(
        dev_endpoint=endpoint,
        dev_host_key=HOST_KEY,
        dev_connections=connections,
        dev_last_activity=timezone.now() - timedelta(minutes=3),
    )
    return job


# --------------------------------------------------------------------------- the kind's rules


def test_a_dev_session_is_one_replica_and_runs_no_command(cast):
    spec = JobSpec(name="d", team=cast.org.team_a, kind=JobKind.DEV, replicas=2, command="python train.py")
    with pytest.raises(ValidationError) as caught:
        job_submit(user=cast.ann, spec=spec)
    errors = caught.value.message_dict
    assert errors["replicas"] == ["A dev session runs as one replica"]
    assert "runs no command" in errors["command"][0]


def test_an_image_is_accepted_and_stored_normalised(cast):
    response = _api(cast.ann).post("/api/v1/dev-sessions", {"team": cast.org.team_a.slug, "image": "ubuntu:24.04"}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get()
    assert (job.kind, job.image) == (JobKind.DEV, "docker.io/library/ubuntu:24.04")


def test_an_image_off_the_registry_allow_list_is_refused_on_its_field(cast, settings):
    settings.YARD = {**settings.YARD, "REGISTRY_ALLOW": ("nvcr.io",)}
    response = _api(cast.ann).post("/api/v1/dev-sessions", {"team": cast.org.team_a.slug, "image": "ubuntu:24.04"}, format="json")
    assert response.status_code == 400 and list(response.json()["fields"]) == ["image"], response.content
    assert not Job.objects.exists()


def test_a_session_in_an_image_waits_for_a_node_with_a_container_runtime_as_any_image_job(cast):
    job = job_submit(user=cast.ann, spec=JobSpec(name="d", team=cast.org.team_a, kind=JobKind.DEV, image="ubuntu:24.04"))
    run_cycle_once()
    job.refresh_from_db()
    assert job.state == JobState.PENDING and job.pending_reason.startswith("needs nodes that run containers"), job.pending_reason
    node = _node()
    Node.objects.filter(pk=node.pk).update(container_runtime="runc", container_runtime_note="container runtime: runc")
    run_cycle_once()
    job.refresh_from_db()
    assert job.state == JobState.STARTING and Task.objects.get(job=job).node_id == node.pk


# --------------------------------------------------------------------------- the API


def test_launch_through_the_api_makes_a_pending_dev_session_without_ssh_yet(cast):
    response = _api(cast.ann).post(
        "/api/v1/dev-sessions", {"team": cast.org.team_a.slug, "gpus": 2, "gpu_type": "H100", "time_limit_s": 7200}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    job = Job.objects.get()
    assert (job.kind, job.state, job.replicas, job.gpus_per_replica, job.command, job.time_limit_s) == (
        JobKind.DEV, JobState.PENDING, 1, 2, "", 7200,
    )  # fmt: skip
    assert (body["kind"], body["name"], body["ssh"], body["notebook_url"]) == ("dev", "dev-ann", None, None)


def test_the_list_holds_dev_sessions_only_and_detail_is_by_kind(cast):
    dev = make_job(team=cast.org.team_a, user=cast.ann, kind=JobKind.DEV, command="")
    notebook = make_job(team=cast.org.team_a, user=cast.ann, kind=JobKind.NOTEBOOK)
    client = _api(cast.ann)
    assert [j["id"] for j in client.get("/api/v1/dev-sessions").json()["results"]] == [dev.pk]
    assert client.get(f"/api/v1/dev-sessions/{dev.pk}").status_code == 200
    assert client.get(f"/api/v1/dev-sessions/{notebook.pk}").status_code == 404
    assert client.get(f"/api/v1/notebooks/{dev.pk}").status_code == 404


def test_another_tenant_gets_404_for_a_dev_session(cast):
    job = _running_session(cast)
    client = _api(cast.zed)
    assert client.get(f"/api/v1/dev-sessions/{job.pk}").status_code == 404
    assert client.post(f"/api/v1/dev-sessions/{job.pk}/stop").status_code == 404
    assert client.get(f"/api/v1/dev-sessions/{job.pk}/logs").status_code == 404
    assert Job.objects.get(pk=job.pk).stop_requested_at is None


def test_stop_through_the_api_stops_it_and_logs_answer(cast):
    job = _running_session(cast)
    client = _api(cast.ann)
    response = client.post(f"/api/v1/dev-sessions/{job.pk}/stop")
    assert response.status_code == 200
    job.refresh_from_db()
    assert job.stop_requested_at is not None and job.stop_reason == "CANCELLED"
    logs = client.get(f"/api/v1/dev-sessions/{job.pk}/logs", {"tail": 10})
    assert logs.status_code == 200 and logs.json()["job"] == job.pk


def test_the_ssh_object_of_a_running_session(cast, settings):
    settings.YARD_NOTEBOOK_URL = ""
    settings.YARD_NOTIFY = {**settings.YARD_NOTIFY, "PUBLIC_URL": "https://yard.example.com"}
    job = _running_session(cast, connections=2)
    ssh = _api(cast.ann).get(f"/api/v1/dev-sessions/{job.pk}").json()["ssh"]
    last = Task.objects.get(job=job).dev_last_activity
    assert ssh == {
        "user": "ann",
        "host_key": HOST_KEY,
        "proxy_path": f"/dev-sessions/{job.pk}/ssh",
        "proxy_url": f"wss://yard.example.com/dev-sessions/{job.pk}/ssh",
        "connections": 2,
        "last_activity": last.astimezone(timezone.get_current_timezone()).isoformat().replace("+00:00", "Z"),
    }


def test_the_login_account_is_the_one_the_agent_reported(client, cast):
    job = _running_session(cast)
    Task.objects.filter(job=job).update(dev_login="root")  # an agent run as root, not --run-as-owner
    assert _api(cast.ann).get(f"/api/v1/dev-sessions/{job.pk}").json()["ssh"]["user"] == "root"
    client.force_login(cast.ann)
    body = client.get(reverse("dev-session", args=[job.pk])).content.decode()
    assert 'id="dev-ssh-user">root<' in body and "its agent's account, not as their owners'" in body


def test_the_tunnel_is_on_the_notebook_proxys_address_where_that_is_set(cast, settings):
    settings.YARD_NOTEBOOK_URL = "http://127.0.0.1:8001"
    job = _running_session(cast)
    ssh = _api(cast.ann).get(f"/api/v1/dev-sessions/{job.pk}").json()["ssh"]
    assert ssh["proxy_url"] == f"ws://127.0.0.1:8001/dev-sessions/{job.pk}/ssh"


def test_no_ssh_object_before_sshd_reports_nor_after_it_stopped(cast):
    job = _running_session(cast, endpoint="")
    client = _api(cast.ann)
    assert client.get(f"/api/v1/dev-sessions/{job.pk}").json()["ssh"] is None
    Task.objects.filter(job=job).update(dev_endpoint="10.0.0.5:20001", state=TaskState.EXITED)
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    assert client.get(f"/api/v1/dev-sessions/{job.pk}").json()["ssh"] is None


def test_a_batch_job_has_no_ssh_object(cast):
    job = running_job(team=cast.org.team_a, user=cast.ann, node=_node(), start=timezone.now())
    assert _api(cast.ann).get(f"/api/v1/jobs/{job.pk}").json()["ssh"] is None


# --------------------------------------------------------------------------- the pages


def test_the_nav_links_to_dev_sessions(client, cast):
    client.force_login(cast.ann)
    assert f'href="{reverse("dev-sessions")}">Dev sessions<' in client.get(reverse("dashboard")).content.decode()


def test_launch_through_the_form_and_find_it_in_the_list(client, cast):
    client.force_login(cast.ann)
    response = client.post(
        reverse("dev-session-new"), {"team": cast.org.team_a.pk, "gpu_type": "H100", "gpus": 1, "tier": 2, "time_limit_h": "2"}
    )
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("dev-session", args=[job.pk])
    assert (job.kind, job.time_limit_s, job.name) == (JobKind.DEV, 7200, "dev-ann")
    listing = client.get(reverse("dev-sessions")).content.decode()
    assert f'href="{reverse("dev-session", args=[job.pk])}"' in listing


def test_the_form_takes_an_image(client, cast):
    client.force_login(cast.ann)
    assert 'name="image"' in client.get(reverse("dev-session-new")).content.decode()
    data = {"team": cast.org.team_a.pk, "gpu_type": "H100", "gpus": 1, "tier": 2, "image": "ubuntu:24.04"}
    assert client.post(reverse("dev-session-new"), data).status_code == 302
    assert Job.objects.get().image == "docker.io/library/ubuntu:24.04"
    bad = client.post(reverse("dev-session-new"), {**data, "image": "Not An Image!"})
    assert bad.status_code == 400 and Job.objects.count() == 1


def test_a_refusal_is_said_on_the_form(client, cast):
    quota_set(actor=None, unit=cast.org.root, gpu_type="B200", guaranteed=8)  # budgeted before its nodes arrive
    client.force_login(cast.ann)
    response = client.post(reverse("dev-session-new"), {"team": cast.org.team_a.pk, "gpu_type": "B200", "gpus": 1, "tier": 2})
    assert response.status_code == 400 and "the cluster has no B200 GPUs" in response.content.decode()
    assert not Job.objects.exists()


def test_without_a_key_the_pages_say_so_and_link_to_the_ssh_keys_page(client, cast):
    client.force_login(cast.ann)
    for url in (reverse("dev-sessions"), reverse("dev-session-new")):
        body = client.get(url).content.decode()
        assert 'id="no-ssh-keys"' in body and f'href="{reverse("ssh-keys")}"' in body
    job = _running_session(cast)
    assert 'id="no-ssh-keys"' in client.get(reverse("dev-session", args=[job.pk])).content.decode()
    ssh_key_add(user=cast.ann, name="laptop", public_key=ED25519)
    assert 'id="no-ssh-keys"' not in client.get(reverse("dev-session", args=[job.pk])).content.decode()


def test_the_session_page_says_how_to_connect_its_node_connections_and_last_activity(client, cast):
    job = _running_session(cast, connections=2)
    client.force_login(cast.ann)
    body = client.get(reverse("dev-session", args=[job.pk])).content.decode()
    text = " ".join(re.sub(r"<[^>]+>", " ", body).split())
    assert f"yard ssh {job.pk}" in text and f"yard ssh --config {job.pk} &gt;&gt; ~/.ssh/config" in body
    assert "2 SSH connections open" in text and 'id="dev-last-activity"' in body
    assert HOST_KEY in body and f'id="dev-node">{_node().name}<' in body
    assert "Stop dev session" in body


def test_a_teammate_sees_the_session_but_not_how_to_log_in_nor_the_stop(client, cast):
    job = _running_session(cast)
    client.force_login(cast.ben)
    assert client.get(reverse("dev-session", args=[job.pk])).status_code == 404  # another team
    from tests.factories import make_user

    client.force_login(make_user("amy", unit=cast.org.team_a))
    body = client.get(reverse("dev-session", args=[job.pk])).content.decode()
    assert f"yard ssh {job.pk}" not in body and "Only its owner, ann, can log in" in body
    assert "Stop dev session" not in body and 'id="no-ssh-keys"' not in body


def test_another_tenant_gets_404_and_a_notebook_is_not_a_dev_session(client, cast):
    job = _running_session(cast)
    notebook = make_job(team=cast.org.team_a, user=cast.ann, kind=JobKind.NOTEBOOK)
    client.force_login(cast.zed)
    assert client.get(reverse("dev-session", args=[job.pk])).status_code == 404
    assert client.post(reverse("dev-session", args=[job.pk]), {"action": "stop"}).status_code == 404
    client.force_login(cast.ann)
    assert client.get(reverse("dev-session", args=[notebook.pk])).status_code == 404


def test_stop_from_the_page_and_the_stopped_page_stops_polling(client, cast):
    job = _running_session(cast)
    client.force_login(cast.ann)
    page = reverse("dev-session", args=[job.pk])
    assert client.get(page, **HTMX).status_code == 200
    response = client.post(page, {"action": "stop"})
    assert response.status_code == 302 and response["Location"] == page
    job.refresh_from_db()
    assert job.stop_requested_at is not None
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    assert client.get(page, **HTMX).status_code == 286
    assert client.post(page, {"action": "nonsense"}).status_code == 400


def test_the_team_lead_may_stop_it_but_not_extend_it(client, cast):
    job = _running_session(cast)
    client.force_login(cast.lea)
    page = reverse("dev-session", args=[job.pk])
    assert "Keep it" not in client.get(page).content.decode()
    assert client.post(page, {"action": "extend"}).status_code == 403
    assert client.post(page, {"action": "stop"}).status_code == 302


# --------------------------------------------------------------------------- the idle reaper


def _after(minutes: int) -> datetime:
    return T0 + minutes * MINUTE + timedelta(seconds=7)


def test_the_reaper_warns_and_stops_an_idle_dev_session_as_a_notebook_open_ssh_or_not(cast):
    node = _node()
    dev = running_job(team=cast.org.team_a, user=cast.ann, node=node, gpus=2, start=T0, kind=JobKind.DEV)
    notebook = running_job(team=cast.org.team_a, user=cast.ben, node=node, gpus=2, start=T0, kind=JobKind.NOTEBOOK)
    # An SSH connection open all along, busy a moment ago: the GPUs decide, not the connection.
    Task.objects.filter(job=dev).update(dev_connections=3, dev_last_activity=_after(46))
    for job in (dev, notebook):
        telemetry(job, start=T0, minutes=46, utilization=0)
    assert reap_idle_notebooks(now=_after(34)).warned == []
    assert reap_idle_notebooks(now=_after(35)).warned == [dev.pk, notebook.pk]
    assert reap_idle_notebooks(now=_after(46)).reaped == [dev.pk, notebook.pk]
    dev.refresh_from_db()
    assert dev.stop_reason == "IDLE_TIMEOUT" and dev.stop_requested_at is not None
    notes = JobEvent.objects.filter(job=dev, actor_label=REAPER_LABEL, to_state="").order_by("pk")
    reasons = [n.reason for n in notes if n.reason.startswith("idle")]
    assert reasons[0].startswith("idle warning:") and reasons[-1] == "idle for 45 min (GPU telemetry): stopping the dev session"


def test_a_dev_session_whose_gpus_are_used_is_kept(cast):
    dev = running_job(team=cast.org.team_a, user=cast.ann, node=_node(), start=T0, kind=JobKind.DEV)
    Task.objects.filter(job=dev).update(dev_connections=0)
    telemetry(dev, start=T0, minutes=120, utilization=75)
    report = reap_idle_notebooks(now=_after(120))
    assert report.warned == [] and report.reaped == []


def test_the_idle_notifications_name_the_dev_session_and_link_its_page(cast):
    dev = running_job(team=cast.org.team_a, user=cast.ann, node=_node(), start=T0, kind=JobKind.DEV)
    telemetry(dev, start=T0, minutes=46, utilization=0)
    reap_idle_notebooks(now=_after(35))
    reap_idle_notebooks(now=_after(46))
    specs = [from_job_event(row) for row in JobEvent.objects.filter(job=dev, to_state="").order_by("pk")]
    assert [(s.kind, s.title, s.link) for s in specs if s is not None] == [
        (Kind.IDLE_WARNING, f"Dev session #{dev.pk} {dev.name} is idle and will be stopped", f"/dev-sessions/{dev.pk}/"),
        (Kind.IDLE_STOPPED, f"Dev session #{dev.pk} {dev.name} stopped: idle", f"/dev-sessions/{dev.pk}/"),
    ]


def test_the_owner_is_warned_on_every_page_and_extends_it_from_the_banner(client, cast):
    now = timezone.now()
    dev = running_job(team=cast.org.team_a, user=cast.ann, node=_node(), start=now - timedelta(hours=1), kind=JobKind.DEV)
    telemetry(dev, start=last_complete_window(now) - timedelta(minutes=39), minutes=40, utilization=0.0)
    assert reap_idle_notebooks(now=now).warned == [dev.pk]
    assert [w.job.pk for w in idle_warnings_for(cast.ann)] == [dev.pk]
    client.force_login(cast.ann)
    banner = client.get(reverse("jobs")).content.decode()
    page = reverse("dev-session", args=[dev.pk])
    assert f'Your dev session <a href="{page}">' in banner and f'action="{page}"' in banner
    response = client.post(page, {"action": "extend", "next": reverse("jobs")})
    assert response.status_code == 302 and response["Location"] == reverse("jobs")
    dev.refresh_from_db()
    assert dev.idle_extended_at is not None and dev.idle_warned_at is None
    body = client.get(page).content.decode()
    assert "Extended by its owner until" in body and "Keep it" not in body


def test_a_dev_session_in_the_jobs_list_links_to_its_page(client, cast):
    job = _running_session(cast)
    client.force_login(cast.ann)
    assert f'href="{reverse("dev-session", args=[job.pk])}"' in client.get(reverse("jobs")).content.decode()


def test_the_tunnel_path_reaching_the_web_tier_says_what_to_route(client):
    answer = client.get("/dev-sessions/42/ssh")
    assert answer.status_code == 502 and answer.json()["code"] == "proxy_not_routed"
