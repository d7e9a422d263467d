"""The cluster map: states and reasons, team colours, a fixed number of queries."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from scheduling.models import Allocation, Gpu, Node, NodeState, Task
from scheduling.states import JobState
from tests.factories import make_cluster, make_job


def test_map_marks_a_down_node_with_its_reason(client, cast):
    Node.objects.filter(name="h100-02").update(state=NodeState.DOWN, state_reason="missed heartbeats for 300 s")
    client.force_login(cast.ann)
    body = client.get(reverse("cluster")).content.decode()
    assert "missed heartbeats for 300 s" in body and 'class="node DOWN"' in body


def test_map_colours_busy_gpus_by_team_and_counts_stranded_free_gpus(client, cast):
    job = make_job(team=cast.org.team_a, user=cast.ann, state=JobState.RUNNING, gpus_per_replica=3)
    gpus = list(Gpu.objects.filter(node__name="h100-01")[:3])
    task = Task.objects.create(job=job, attempt=1, rank=0, node=gpus[0].node, state="RUNNING")
    for gpu in gpus:
        Allocation.objects.create(gpu=gpu, task=task, job=job, attempt=1)
    client.force_login(cast.ann)
    response = client.get(reverse("cluster"))
    assert response.context["summary"]["busy"] == 3
    assert response.context["summary"]["fragmented_free"] == 5
    assert ("team-a", response.context["summary"]["teams"][0][1]) == response.context["summary"]["teams"][0]


def test_map_query_count_is_fixed_from_4_to_40_nodes(client, cast):
    client.force_login(cast.ann)
    with CaptureQueriesContext(connection) as small:
        client.get(reverse("cluster"))
    Node.objects.all().delete()
    from scheduling.models import Leaf, Spine

    Leaf.objects.all().delete()
    Spine.objects.all().delete()
    make_cluster(nodes=40, spines=2, leaves_per_spine=2)
    with CaptureQueriesContext(connection) as large:
        response = client.get(reverse("cluster"))
    assert response.context["summary"]["gpus"] == 320
    assert len(small) == len(large)


def test_map_htmx_refresh_gets_only_the_map(client, cast):
    client.force_login(cast.ann)
    body = client.get(reverse("cluster"), HTTP_HX_REQUEST="true").content.decode()
    assert 'id="cluster-map"' in body and "<html" not in body


def test_map_says_which_nodes_run_containers(client, cast):
    Node.objects.filter(name="h100-01").update(
        container_runtime="runc", container_runtime_note="container runtime: runc (/usr/sbin/runc)"
    )
    client.force_login(cast.ann)
    response = client.get(reverse("cluster"))
    body = response.content.decode()
    assert f"1 of {Node.objects.count()} nodes run containers" in body
    assert 'data-runtime="runc" title="container runtime: runc (/usr/sbin/runc)"' in body
    assert "· no containers" in body
