"""MIG instances in the cycle: a job of a slice type runs on slices of that type only, and whole-GPU jobs never on them."""

import uuid

import pytest
from django.utils import timezone

from scheduling.cycle import run_cycle_once
from scheduling.models import Gpu, Job, Task
from scheduling.selectors import invariant_violations, snapshot_build
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState
from tenants.services import quota_set
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db
SLICE = "H100.1g.10gb"


@pytest.fixture
def mig_node(org):
    """One READY 8-GPU H100 node whose GPU 7 is in MIG mode: seven 1g.10gb instances."""
    (node,) = make_cluster(nodes=1, leaves_per_spine=1)
    parent = Gpu.objects.get(node=node, index=7)
    for i in range(7):
        Gpu.objects.create(
            node=node, index=128 + 56 + i, uuid=f"MIG-{uuid.uuid4()}", gpu_type=SLICE, mig_profile="1g.10gb",
            parent_uuid=parent.uuid, memory_mb=9984, nvlink_domain=parent.nvlink_domain, pcie_switch=parent.pcie_switch,
            numa_node=parent.numa_node,
        )  # fmt: skip
    parent.delete()  # a MIG-enabled GPU is reported as its instances only
    for unit in (org.root, org.bu, org.dept, org.team_a):
        quota_set(actor=None, unit=unit, gpu_type=SLICE, guaranteed=7)
    return node


def submit(org, user, **kw):
    return job_submit(user=user, spec=JobSpec(name="j", team=org.team_a, command="true", **kw))


def test_the_snapshot_keeps_a_nodes_slices_apart_from_its_whole_gpus(mig_node):
    nodes = {n.name: n for n in snapshot_build(now=timezone.now()).topology.nodes}
    assert (nodes[mig_node.name].gpu_type, len(nodes[mig_node.name].gpus)) == ("H100", 7)
    slices = nodes[f"{mig_node.name}~{SLICE}"]
    assert (slices.gpu_type, len(slices.gpus), slices.leaf) == (SLICE, 7, nodes[mig_node.name].leaf)


def test_slice_jobs_run_on_slices_and_whole_gpu_jobs_on_whole_gpus(org, ann, mig_node):
    whole = submit(org, ann, gpus_per_replica=7)
    notebooks = [submit(org, ann, gpus_per_replica=1, gpu_type=SLICE) for _ in range(8)]
    run_cycle_once()
    whole.refresh_from_db()
    assert whole.state == JobState.STARTING
    whole_gpus = Gpu.objects.filter(allocations__job=whole)
    assert set(whole_gpus.values_list("gpu_type", flat=True)) == {"H100"}
    placed = [j for j in Job.objects.filter(pk__in=[n.pk for n in notebooks]) if j.state == JobState.STARTING]
    assert len(placed) == 7  # seven slices; the eighth waits
    for job in placed:
        (task,) = Task.objects.filter(job=job)
        gpu = Gpu.objects.get(allocations__job=job)
        assert task.node_id == mig_node.pk and gpu.gpu_type == SLICE and task.gpu_indices == [gpu.index]
    assert invariant_violations() == []
