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
