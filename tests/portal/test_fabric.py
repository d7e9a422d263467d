"""Multi-node NVLink domains in the portal: the job form keeps "One NVLink fabric domain", the snapshot
gives the scheduler each node's domain, and the cluster map draws the domains inside their leaf."""

from __future__ import annotations

from django.urls import reverse
from django.utils import timezone

from scheduling.models import Job, Node
from scheduling.selectors import snapshot_build
from tests.portal.test_jobs import _submit_data


def test_submit_keeps_one_fabric_and_run_again_and_copy_keep_it_too(client, cast):
    client.force_login(cast.ann)
    client.post(reverse("job-submit"), _submit_data(cast, one_fabric="on"))
    job = Job.objects.get()
    assert job.one_fabric is True
    client.post(reverse("job-rerun", args=[job.pk]))
    assert Job.objects.exclude(pk=job.pk).get().one_fabric is True
    page = client.get(reverse("job-submit") + f"?from={job.pk}").content.decode()
    assert 'name="one_fabric"' in page and "checked" in page.split('name="one_fabric"')[1].split(">")[0]
    client.post(reverse("job-submit"), _submit_data(cast, name="plain"))
    assert Job.objects.get(name="plain").one_fabric is False


def test_snapshot_carries_node_fabric_domains_and_one_fabric_jobs(client, cast):
    Node.objects.filter(name__in=["h100-01", "h100-02"]).update(fabric_domain="nvl72-rack-1")
    client.force_login(cast.ann)
    client.post(reverse("job-submit"), _submit_data(cast, one_fabric="on"))
    snap = snapshot_build(now=timezone.now())
    fabric = {n.name: n.fabric for n in snap.topology.nodes}
    assert fabric["h100-01"] == fabric["h100-02"] == "nvl72-rack-1"
    assert {n.fabric for n in snap.topology.nodes if n.name not in ("h100-01", "h100-02")} == {""}
    (pending,) = snap.pending
    assert pending.one_fabric is True


def test_cluster_map_draws_a_box_per_fabric_domain_inside_its_leaf(client, cast):
    Node.objects.filter(name__in=["h100-01", "h100-02"]).update(fabric_domain="nvl72-rack-1")
    client.force_login(cast.ann)
    response = client.get(reverse("cluster"))
    body = response.content.decode()
    assert body.count('data-fabric="nvl72-rack-1"') == 1
    box = body.split('data-fabric="nvl72-rack-1"')[1].split("</div>\n        </div>")[0]
    assert "NVLink domain nvl72-rack-1" in box and "h100-01" in box and "h100-02" in box and "h100-03" not in box


def test_submit_keeps_one_per_node_and_the_scheduler_gives_each_replica_its_own_node(client, cast):
    """The form's "One replica per node" is the API's one_per_node (Slurm's --nodes=N): stored, kept by run
    again and copy, and honoured by the placement: two 1-GPU replicas land on two nodes, not one."""
    from scheduling.cycle import run_cycle_once

    client.force_login(cast.ann)
    client.post(reverse("job-submit"), _submit_data(cast, name="spread", replicas="2", gpus_per_replica="1", one_per_node="on"))
    job = Job.objects.get(name="spread")
    assert job.one_per_node is True
    page = client.get(reverse("job-submit") + f"?from={job.pk}").content.decode()
    assert 'name="one_per_node"' in page and "checked" in page.split('name="one_per_node"')[1].split(">")[0]
    client.post(reverse("job-submit"), _submit_data(cast, name="packed", replicas="2", gpus_per_replica="1"))
    assert Job.objects.get(name="packed").one_per_node is False
    run_cycle_once()
    spread_nodes = set(Job.objects.get(name="spread").tasks.values_list("node_id", flat=True))
    packed_nodes = set(Job.objects.get(name="packed").tasks.values_list("node_id", flat=True))
    assert len(spread_nodes) == 2
    assert len(packed_nodes) == 1  # best-fit packing puts both on one node when nothing asks otherwise
