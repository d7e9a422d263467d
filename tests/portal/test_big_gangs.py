"""A 24 x 8 gang's page: ranks grouped by node (24 lines, not 192), the log near the top, download."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scheduling.models import Allocation, Gpu, GpuWindow, Node, Task, TaskLogChunk
from scheduling.states import JobState
from tests.factories import make_cluster, make_job, make_org, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def gang():
    org = make_org(total=256)
    make_cluster(nodes=24)
    ann = make_user("ann", unit=org.team_a)
    job = make_job(team=org.team_a, user=ann, state=JobState.RUNNING, replicas=24, gpus_per_replica=8, name="big")
    for rank, node in enumerate(Node.objects.order_by("name")):
        task = Task.objects.create(job=job, attempt=1, rank=rank, node=node, state="RUNNING")
        Allocation.objects.bulk_create(Allocation(gpu=g, task=task, job=job, attempt=1) for g in node.gpus.all())
        TaskLogChunk.objects.create(task=task, offset=0, data="".join(f"rank {rank} line {i}\n" for i in range(300)))
    GpuWindow.objects.bulk_create(
        GpuWindow(gpu=g, start=job.submitted_at, samples=6, utilization_sum=480, utilization_max=80) for g in Gpu.objects.all()
    )
    return ann, job


def test_a_big_gang_is_one_line_per_node_with_its_gpus_drawn_only_on_demand(client, gang):
    ann, job = gang
    client.force_login(ann)
    body = client.get(reverse("job", args=[job.pk])).content.decode()
    assert body.count('<details class="node-group"') == 24
    assert body.count('<svg class="sparkline"') == 0  # 192 charts only when asked for
    assert "24 of 24 ranks running on 24 nodes" in body
    first = Node.objects.order_by("name").first()
    opened = client.get(reverse("job", args=[job.pk]), {"open": first.name}, HTTP_HX_REQUEST="true").content.decode()
    assert opened.count('<svg class="sparkline"') == 8 and f'data-node="{first.name}" open' in opened


def test_the_log_comes_before_the_placement_and_follows_by_default(client, gang):
    ann, job = gang
    client.force_login(ann)
    body = client.get(reverse("job", args=[job.pk]), {"rank": 3}).content.decode()
    assert body.index('id="log-card"') < body.index('id="placement"')
    assert 'id="log-follow" hx-preserve="true" checked' in body
    assert "rank 3 line 299" in body and "rank 3 line 0\n" not in body  # the tail only
    assert f'href="/jobs/{job.pk}/log/?rank=3"' in body
    assert 'name="rank" data-autosubmit' in body  # 24 ranks: a menu, not 24 tabs


def test_the_log_downloads_whole(client, gang):
    ann, job = gang
    client.force_login(ann)
    response = client.get(reverse("job-log", args=[job.pk]), {"rank": 5})
    text = b"".join(response.streaming_content).decode()
    assert response["Content-Disposition"] == f'attachment; filename="job-{job.pk}-attempt-1-rank-5.log"'
    assert text.splitlines() == [f"rank 5 line {i}" for i in range(300)]


def test_the_log_of_another_tenants_job_is_404(client, gang):
    _, job = gang
    client.force_login(make_user("zed"))
    assert client.get(reverse("job-log", args=[job.pk])).status_code == 404


def test_the_page_costs_the_same_queries_for_a_big_gang(client, gang):
    ann, job = gang
    client.force_login(ann)
    with CaptureQueriesContext(connection) as ctx:
        client.get(reverse("job", args=[job.pk]))
    assert len(ctx) < 25  # a fixed number, not one per rank or GPU
