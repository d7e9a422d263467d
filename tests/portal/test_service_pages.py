"""The services pages: the list, a new service through the form, its page (live by htmx polling), and what its
managers may do there (scale, roll out, roll back, tokens, delete); another tenant gets 404."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from scheduling.models import Job, Service, ServiceState, ServiceToken, ServiceWindow, Task, TaskLogChunk
from scheduling.serving.controller import reconcile
from scheduling.serving.selectors import SERVICE_LATENCY_EDGES_MS
from scheduling.serving.services import ServiceSpec, service_create, service_update, token_hash
from scheduling.states import JobState
from tests.serving.conftest import live, start, tick

HTMX = {"HTTP_HX_REQUEST": "true"}


def _create(cast, user=None, **fields) -> Service:
    spec = ServiceSpec(**{"name": "chat", "team": cast.org.team_a, "gpu_type": "H100", "command": "serve", **fields})
    return service_create(user=user or cast.ann, spec=spec)


def _running(service: Service) -> Job:
    """One replica placed by the real controller and cycle, started and ready as its agent would report."""
    tick(service)
    job = live(service)[0]
    start(job)
    reconcile(service_id=service.pk)  # the controller sees it ready: the first rollout is complete
    return job


def _traffic(service: Service, job: Job, *, requests: int = 600, errors: int = 6) -> None:
    """What a proxy wrote of one 5-s window, 20 s ago: ``requests`` at about 10 ms, a few errors."""
    counts = [0] * (len(SERVICE_LATENCY_EDGES_MS) + 1)
    bucket = next(i for i, edge in enumerate(SERVICE_LATENCY_EDGES_MS) if edge >= 10)
    counts[bucket] = requests
    ServiceWindow.objects.create(
        service=service,
        start=timezone.now() - timedelta(seconds=20),
        source="test:1",
        requests=requests,
        errors=errors,
        busy_s=requests * 0.01,
        latency_counts=counts,
        per_replica={str(job.pk): [requests, requests * 0.01]},
    )


def _page(client, service: Service) -> str:
    return " ".join(client.get(reverse("service", args=[service.pk])).content.decode().split())


def _post(client, service: Service, action: str, **data):
    return client.post(reverse("service", args=[service.pk]), {"action": action, **data})


FORM = {
    "team": None,  # filled in per test
    "name": "embed",
    "tier": "2",
    "gpu_type": "H100",
    "gpus_per_node": "2",
    "nodes_per_replica": "2",
    "replicas": "2",
    "min_replicas": "1",
    "max_replicas": "3",
    "target_inflight": "2.5",
    "image": "",
    "command": "python -m http.server $PORT",
    "env": "MODEL=small\nWORKERS=2",
    "port": "9000",
    "readiness_path": "/ready",
    "liveness_path": "/alive",
    "progress_deadline_s": "120",
}


# --------------------------------------------------------------------------- the list


def test_the_list_shows_ready_and_wanted_replicas_revision_rollout_and_traffic(client, cast):
    service = _create(cast)
    job = _running(service)
    _traffic(service, job)
    client.force_login(cast.ann)
    body = " ".join(client.get(reverse("services")).content.decode().split())
    row = body.split(f'data-service="{service.pk}"', 1)[1].split("</tr>", 1)[0]
    assert f'href="{reverse("service", args=[service.pk])}">chat</a>' in row
    assert "team-a" in row and '<td class="num replicas">1 / 1' in row
    assert '<td class="num">10.00</td>' in row  # 600 requests in the last minute
    assert "ms" in row and "—" not in row.split("10.00", 1)[1]
    assert 'href="/services/new"' in body


def test_the_list_leaves_out_another_tenants_services(client, cast):
    _create(cast, name="ours")
    service_create(user=cast.zed, spec=ServiceSpec(name="theirs", team=cast.org.team_c, gpu_type="H100", command="serve"))
    client.force_login(cast.ann)
    body = client.get(reverse("services")).content.decode()
    assert "ours" in body and "theirs" not in body


def test_the_nav_links_to_the_services(client, cast):
    client.force_login(cast.ann)
    assert f'<a href="{reverse("services")}">Services</a>' in client.get(reverse("dashboard")).content.decode()


def test_the_pages_need_a_sign_in(client, cast):
    service = _create(cast)
    for url in (reverse("services"), reverse("service-new"), reverse("service", args=[service.pk])):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]


# --------------------------------------------------------------------------- create


def test_the_new_service_form_defaults_to_tier_1_and_a_gpu_type_of_the_team(client, cast):
    client.force_login(cast.ann)
    body = client.get(reverse("service-new")).content.decode()
    assert '<option value="1" selected>' in body
    assert '<option value="H100" selected>' in body


def test_a_bad_new_service_shows_each_error_by_its_field_and_creates_nothing(client, cast):
    client.force_login(cast.ann)
    data = {**FORM, "team": cast.org.team_a.pk, "name": "Not A Slug", "command": "", "max_replicas": "1"}
    response = client.post(reverse("service-new"), data)
    assert response.status_code == 400
    body = response.content.decode()
    assert 'id="id_name-error"' in body and "part of a URL" in body  # the service's checks, all at once
    assert 'id="id_command-error"' in body
    assert 'id="id_replicas-error"' in body
    assert 'value="MODEL=small' in body.replace("\n", "") or "MODEL=small" in body  # what was typed stays
    response = client.post(reverse("service-new"), {**FORM, "team": cast.org.team_a.pk, "readiness_path": "health"})
    assert response.status_code == 400
    assert 'id="id_readiness_path-error"' in response.content.decode() and "starting with /" in response.content.decode()
    assert not Service.objects.exists()


def test_a_new_service_that_could_never_run_says_why(client, cast):
    client.force_login(cast.ann)
    data = {**FORM, "team": cast.org.team_a.pk, "nodes_per_replica": "1", "gpus_per_node": "16"}
    response = client.post(reverse("service-new"), data)
    assert response.status_code == 400
    assert "the largest H100 node has 8" in response.content.decode()
    assert not Service.objects.exists()


def test_creating_a_service_through_the_form_sets_every_field_and_opens_its_page(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("service-new"), {**FORM, "team": cast.org.team_a.pk})
    service = Service.objects.get()
    assert response.status_code == 302 and response["Location"] == reverse("service", args=[service.pk])
    revision = service.revisions.get()
    got = {
        "team": service.team, "name": service.name, "tier": service.tier, "gpu_type": service.gpu_type,
        "gpus_per_node": service.gpus_per_node, "nodes_per_replica": service.nodes_per_replica,
        "replicas": service.replicas, "min_replicas": service.min_replicas, "max_replicas": service.max_replicas,
        "target_inflight": service.target_inflight, "command": revision.command, "env": revision.env,
        "port": service.port, "readiness_path": service.readiness_path, "liveness_path": service.liveness_path,
        "progress_deadline_s": service.progress_deadline_s, "user": service.user,
    }  # fmt: skip
    assert got == {
        "team": cast.org.team_a, "name": "embed", "tier": 2, "gpu_type": "H100", "gpus_per_node": 2,
        "nodes_per_replica": 2, "replicas": 2, "min_replicas": 1, "max_replicas": 3, "target_inflight": 2.5,
        "command": "python -m http.server $PORT", "env": {"MODEL": "small", "WORKERS": "2"}, "port": 9000,
        "readiness_path": "/ready", "liveness_path": "/alive", "progress_deadline_s": 120, "user": cast.ann,
    }  # fmt: skip
    page = _page(client, service)
    assert "Created service team-a/embed" in page


def test_the_image_field_is_stored_normalised(client, cast):
    client.force_login(cast.ann)
    client.post(reverse("service-new"), {**FORM, "team": cast.org.team_a.pk, "image": "vllm/vllm-openai:v0.6.3", "command": ""})
    revision = Service.objects.get().revisions.get()
    assert revision.image.endswith("vllm/vllm-openai:v0.6.3") and revision.command == ""


def test_a_new_service_for_another_tenants_team_is_refused(client, cast):
    client.force_login(cast.ann)
    response = client.post(reverse("service-new"), {**FORM, "team": cast.org.team_c.pk})
    assert response.status_code == 400 and 'id="id_team-error"' in response.content.decode()
    assert not Service.objects.exists()


# --------------------------------------------------------------------------- its page


def test_the_page_shows_the_endpoint_replicas_rollout_and_traffic(client, cast):
    service = _create(cast)
    job = _running(service)
    _traffic(service, job)
    client.force_login(cast.ann)
    page = _page(client, service)
    assert "http://testserver/services/team-a/chat/" in page
    row = page.split(f'data-job="{job.pk}"', 1)[1].split("</tr>", 1)[0]
    assert f'href="{reverse("job", args=[job.pk])}"' in row and ">ready</span>" in row
    assert Task.objects.get(job=job, rank=0).node.name in row
    assert '<dd id="stat-rps">10.00</dd>' in page  # 600 requests in the last minute
    assert "6 of 600 requests" in page
    assert 'id="stat-latency">' in page and " ms" in page.split('id="stat-latency">', 1)[1][:40]
    assert 'id="rollout-state">complete' in page
    assert "1 of 1 at revision 1, 1 ready" in page
    assert 'id="service-ready">1 / 1 ready' in page


def test_a_pending_replica_says_why_it_waits_and_when_it_may_start(client, cast):
    service = _create(cast)
    tick(service)
    job = live(service)[0]
    eta = timezone.now() + timedelta(hours=2)
    Job.objects.filter(pk=job.pk).update(state=JobState.PENDING, pending_reason="waiting for 1 H100", estimated_start=eta)
    client.force_login(cast.ann)
    page = _page(client, service)
    assert "Waiting: waiting for 1 H100" in page and "estimated start" in page
    assert ">pending</span>" in page


def test_a_replica_not_yet_placed_says_it_is_starting(client, cast):
    service = _create(cast)
    reconcile(service_id=service.pk)  # made, not yet through a cycle
    client.force_login(cast.ann)
    page = _page(client, service)
    assert "Starting: the scheduler places it at its next cycle" in page and "Waiting:" not in page


def test_a_crash_looping_replica_shows_its_message_and_last_log_lines(client, cast):
    service = _create(cast)
    job = _running(service)
    task = Task.objects.get(job=job, rank=0)
    Task.objects.filter(pk=task.pk).update(
        service_ready=False, service_crash_looping=True, service_restarts=4, service_message="exit code 3 before ready"
    )
    lines = "".join(f"line {i}\n" for i in range(40)) + "Traceback: ModuleNotFoundError: vllm\n"
    TaskLogChunk.objects.create(task=task, offset=0, data=lines)
    client.force_login(cast.ann)
    page = _page(client, service)
    assert ">crash-looping</span>" in page
    assert "Crash-looping: exit code 3 before ready" in page
    assert "ModuleNotFoundError: vllm" in page and "line 39" in page and "line 5 " not in page
    assert '<td class="num">4</td>' in page


def test_the_htmx_poll_gets_only_the_live_fragment(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    response = client.get(reverse("service", args=[service.pk]), **HTMX)
    body = response.content.decode()
    assert response.status_code == 200
    assert body.lstrip().startswith('<div id="live"') and 'hx-trigger="every 3s"' in body
    assert "<html" not in body and 'id="endpoint"' not in body and 'id="scale-form"' not in body


def test_polling_stops_once_the_service_is_deleted(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    Service.objects.filter(pk=service.pk).update(state=ServiceState.DELETED)
    response = client.get(reverse("service", args=[service.pk]), **HTMX)
    assert response.status_code == 286
    assert "no longer exists" in response.content.decode()
    assert client.get(reverse("service", args=[service.pk])).status_code == 404


def test_a_service_being_deleted_keeps_polling_and_offers_no_actions(client, cast):
    service = _create(cast)
    Service.objects.filter(pk=service.pk).update(state=ServiceState.DELETING)
    client.force_login(cast.ann)
    page = _page(client, service)
    assert 'id="service-deleting"' in page and 'hx-trigger="every 3s"' in page
    assert 'id="manage"' not in page


# --------------------------------------------------------------------------- who sees what


def test_another_tenant_gets_404_for_the_page_and_every_action(client, cast):
    service = _create(cast)
    client.force_login(cast.zed)
    assert client.get(reverse("service", args=[service.pk])).status_code == 404
    for action, data in (("scale", {"scale-replicas": "3"}), ("delete", {}), ("token", {"token-name": "x"})):
        assert _post(client, service, action, **data).status_code == 404
    service.refresh_from_db()
    assert service.replicas == 1 and service.state == ServiceState.ACTIVE and not service.tokens.exists()


def test_a_manager_sees_the_actions_and_a_read_only_viewer_does_not(client, cast, monkeypatch):
    service = _create(cast)
    client.force_login(cast.lea)  # the team's lead: not its owner, may manage it
    page = _page(client, service)
    for form in ("scale-form", "rollout-form", "token-form", "delete-form"):
        assert f'id="{form}"' in page
    # Everyone who can see a team's services may manage them today (members, leads, admins above); the
    # read-only page is for whoever can_manage_service says no to.
    monkeypatch.setattr("portal.views.services.can_manage_service", lambda **_: False)
    client.force_login(cast.oli)
    page = _page(client, service)
    assert 'id="read-only"' in page and 'id="manage"' not in page and 'id="replicas"' in page
    assert _post(client, service, "scale", **{"scale-replicas": "3"}).status_code == 403
    assert Service.objects.get(pk=service.pk).replicas == 1


def test_an_unknown_action_is_a_bad_request(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    assert _post(client, service, "explode").status_code == 400


# --------------------------------------------------------------------------- actions


def test_scaling_sets_the_wanted_replicas(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    response = _post(client, service, "scale", **{"scale-replicas": "3"})
    assert response.status_code == 302 and response["Location"] == reverse("service", args=[service.pk])
    service.refresh_from_db()
    assert (service.replicas, service.min_replicas, service.max_replicas) == (3, 3, 3)
    assert "Scaled chat to 3 replicas" in _page(client, service)


def test_a_bad_scale_shows_its_error_and_changes_nothing(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    response = _post(client, service, "scale", **{"scale-replicas": "0"})
    assert response.status_code == 400 and 'id="id_scale-replicas-error"' in response.content.decode()
    assert Service.objects.get(pk=service.pk).replicas == 1


def test_a_rollout_makes_a_new_revision_with_the_new_release(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    response = _post(
        client, service, "rollout", **{"rollout-image": "", "rollout-command": "serve --v2", "rollout-env": "MODE=fast"}
    )
    assert response.status_code == 302
    service.refresh_from_db()
    assert service.revision == 2 and service.rollout_state == "progressing"
    revision = service.revisions.get(number=2)
    assert (revision.command, revision.env) == ("serve --v2", {"MODE": "fast"})
    page = _page(client, service)
    assert 'id="rollout-revision">2 (from 1)' in page and "Rolling out revision 2" in page


def test_a_rollout_that_changes_nothing_is_refused(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    response = _post(client, service, "rollout", **{"rollout-image": "", "rollout-command": "serve", "rollout-env": ""})
    assert response.status_code == 400 and "Nothing changed" in response.content.decode()
    assert Service.objects.get(pk=service.pk).revision == 1


def test_rolling_back_rolls_out_the_earlier_revisions_release_again(client, cast):
    service = _create(cast)
    service_update(user=cast.ann, service=service, changes={"command": "serve --broken"})
    client.force_login(cast.ann)
    page = _page(client, service)
    assert '<option value="1">revision 1: serve</option>' in page
    response = _post(client, service, "rollback", **{"rollback-to_revision": "1"})
    assert response.status_code == 302
    service.refresh_from_db()
    assert service.revision == 3 and service.revisions.get(number=3).command == "serve"
    assert "back to revision 1" in service.rollout_message


def test_a_rollback_to_a_revision_that_is_not_there_is_refused(client, cast):
    service = _create(cast)
    service_update(user=cast.ann, service=service, changes={"command": "serve --v2"})
    client.force_login(cast.ann)
    response = _post(client, service, "rollback", **{"rollback-to_revision": "7"})
    assert response.status_code == 400 and 'id="id_rollback-to_revision-error"' in response.content.decode()
    assert Service.objects.get(pk=service.pk).revision == 2


def test_a_new_token_is_shown_once_and_only_its_hash_is_kept(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    response = _post(client, service, "token", **{"token-name": "frontend"})
    assert response.status_code == 200
    body = response.content.decode()
    raw = body.split('<code id="new-token" class="token">', 1)[1].split("</code>", 1)[0]
    assert raw.startswith("ysvc_")
    token = ServiceToken.objects.get(service=service)
    assert token.name == "frontend" and token.token_hash == token_hash(raw) and raw not in token.prefix
    again = client.get(reverse("service", args=[service.pk])).content.decode()
    assert raw not in again and 'id="new-token"' not in again and f"{token.prefix}…" in again


def test_a_token_without_a_name_is_refused_by_its_field(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    response = _post(client, service, "token", **{"token-name": ""})
    assert response.status_code == 400 and 'id="id_token-name-error"' in response.content.decode()
    assert not ServiceToken.objects.exists()


def test_revoking_a_token(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    _post(client, service, "token", **{"token-name": "frontend"})
    token = ServiceToken.objects.get()
    response = _post(client, service, "revoke", token=str(token.pk))
    assert response.status_code == 302
    token.refresh_from_db()
    assert token.revoked_at is not None
    page = _page(client, service)
    assert f'data-token="{token.pk}"' in page and ">revoked</span>" in page


def test_revoking_another_services_token_is_404(client, cast):
    ours, other = _create(cast), _create(cast, name="other")
    client.force_login(cast.ann)
    _post(client, other, "token", **{"token-name": "theirs"})
    token = ServiceToken.objects.get()
    assert _post(client, ours, "revoke", token=str(token.pk)).status_code == 404
    assert ServiceToken.objects.get().revoked_at is None


def test_deleting_a_service_drains_it_and_goes_back_to_the_list(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    _post(client, service, "token", **{"token-name": "frontend"})
    response = _post(client, service, "delete")
    assert response.status_code == 302 and response["Location"] == reverse("services")
    service.refresh_from_db()
    assert service.state == ServiceState.DELETING
    assert ServiceToken.objects.get().revoked_at is not None
    body = client.get(reverse("services")).content.decode()
    assert "Deleting team-a/chat" in body and ">Deleting</span>" in body


def test_the_actions_need_post(client, cast):
    service = _create(cast)
    client.force_login(cast.ann)
    assert client.get(reverse("service", args=[service.pk]), {"action": "delete"}).status_code == 200
    assert Service.objects.get(pk=service.pk).state == ServiceState.ACTIVE
    assert client.put(reverse("service", args=[service.pk])).status_code == 405


@pytest.mark.parametrize("path", ["/services/new", "/services/7/", "/services/"])
def test_no_page_path_is_one_the_service_proxy_would_take(path):
    from portal.service_proxy import PATH

    assert PATH.match(path) is None


def test_a_call_to_a_service_that_reaches_the_web_tier_is_sent_to_the_proxy_or_told_what_to_route(client, settings):
    settings.YARD_NOTEBOOK_URL = ""
    lost = client.post("/services/team-a/chat/v1/completions?stream=1", data=b"{}", content_type="application/json")
    assert lost.status_code == 502 and lost.json()["code"] == "proxy_not_routed"
    settings.YARD_NOTEBOOK_URL = "http://127.0.0.1:8001"
    sent = client.post("/services/team-a/chat/v1/completions?stream=1", data=b"{}", content_type="application/json")
    assert sent.status_code == 307 and sent["Location"] == "http://127.0.0.1:8001/services/team-a/chat/v1/completions?stream=1"
