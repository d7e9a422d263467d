"""Every page answers every role, and shows what that role may see."""

from __future__ import annotations

import pytest
from django.urls import reverse

from scheduling.models import Allocation, JobKind, Node, Task
from tests.factories import make_job

ROLES = ["ann", "lea", "oli", "cat", "zed"]
PAGES = ["dashboard", "jobs", "job-submit", "notebooks", "cluster", "quotas"]


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("page", PAGES)
def test_page_renders_for_each_role(client, cast, role, page):
    client.force_login(getattr(cast, role))
    response = client.get(reverse(page))
    assert response.status_code == 200
    assert b'href="/reports/"' in response.content and b'href="/api/docs/"' in response.content


@pytest.mark.parametrize("page", PAGES)
def test_pages_require_sign_in(client, cast, page):
    response = client.get(reverse(page))
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_every_page_names_the_users_role_and_team(client, cast):
    client.force_login(cast.lea)
    response = client.get(reverse("cluster"))
    assert b"Team lead of team-a" in response.content


def test_dashboard_shows_my_live_jobs_and_not_my_finished_ones(client, cast):
    make_job(team=cast.org.team_a, user=cast.ann, name="live-one", state="RUNNING")
    make_job(team=cast.org.team_a, user=cast.ann, name="done-one", state="COMPLETED")
    client.force_login(cast.ann)
    body = client.get(reverse("dashboard")).content.decode()
    assert "live-one" in body and "done-one" not in body


def test_dashboard_quota_bar_shows_guarantee_and_limit(client, cast):
    client.force_login(cast.ann)
    body = client.get(reverse("dashboard")).content.decode()
    assert "0 in use of 16 guaranteed, limit 32" in body


def test_notebook_list_shows_only_my_notebooks(client, cast):
    make_job(team=cast.org.team_a, user=cast.lea, name="leas-notebook", kind=JobKind.NOTEBOOK)
    make_job(team=cast.org.team_a, user=cast.ann, name="anns-notebook", kind=JobKind.NOTEBOOK)
    client.force_login(cast.ann)
    body = client.get(reverse("notebooks")).content.decode()
    assert "anns-notebook" in body and "leas-notebook" not in body


def test_dashboard_shows_a_team_over_its_guarantee(client, cast):
    # The scheduler marks a whole gang borrowed (it is reclaimed whole), as the cycle does from Plan.borrowed.
    job = make_job(team=cast.org.team_b, user=cast.ben, state="RUNNING", replicas=2, gpus_per_replica=6, borrowed=True)
    for rank, node in enumerate(Node.objects.order_by("name")[:2]):
        task = Task.objects.create(job=job, attempt=1, rank=rank, node=node, state="RUNNING")
        for gpu in node.gpus.all()[:6]:
            Allocation.objects.create(gpu=gpu, task=task, job=job, attempt=1, borrowed=True)
    client.force_login(cast.ben)
    body = client.get(reverse("dashboard")).content.decode()
    # 4 beyond the guarantee is what the team borrows; the whole gang (12) is what a reclaim would take.
    assert "12 in use of 8 guaranteed, limit 16" in body and "4 borrowed beyond the guarantee" in body
    assert "Jobs holding 12 of these GPUs run on borrowed quota" in body
    assert "12 borrowed" not in body


def test_dashboard_poll_returns_only_the_job_list(client, cast):
    client.force_login(cast.ann)
    body = client.get(reverse("dashboard"), HTTP_HX_REQUEST="true").content.decode()
    assert 'id="live-jobs"' in body and "<html" not in body and "quota" not in body
