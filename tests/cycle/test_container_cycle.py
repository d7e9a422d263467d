"""Jobs that name an image in the cycle: placed only on nodes whose agent found a container runtime
(``Node.container_runtime``, the core's CONTAINERS capability), pending with a reason that says how
many nodes have one, and placed once a node's agent reports one."""

import pytest

from scheduling.cycle import run_cycle_once
from scheduling.models import Job, Node, Task
from scheduling.services import JobSpec, job_submit
from scheduling.states import JobState
from tests.factories import make_cluster

pytestmark = pytest.mark.django_db
IMAGE = "registry.corp:5000/ml/train:7"


def submit(org, user, **kw):
    return job_submit(user=user, spec=JobSpec(name="j", team=org.team_a, command="true", **kw))


def test_an_image_job_runs_only_where_a_runtime_is_and_waits_saying_so(org, ann):
    bare, with_runc = make_cluster(nodes=2, leaves_per_spine=1)
    Node.objects.filter(pk=with_runc.pk).update(container_runtime="runc", container_runtime_note="container runtime: runc")
    # Best fit would put a 1-GPU job on the first node (topology order); the image job must go to the other.
    in_image = submit(org, ann, gpus_per_replica=1, image=IMAGE)
    too_big = submit(org, ann, replicas=2, gpus_per_replica=8, image=IMAGE)
    run_cycle_once()
    in_image.refresh_from_db()
    assert in_image.state == JobState.STARTING
    assert Task.objects.get(job=in_image).node_id == with_runc.pk
    too_big.refresh_from_db()
    assert too_big.state == JobState.PENDING
    assert too_big.pending_reason.startswith("needs nodes that run containers: 1 of 2 H100 nodes have a runtime"), (
        too_big.pending_reason
    )
    # A host job of the same shape runs on both nodes meanwhile: the image job's failed search is not its.
    host = submit(org, ann, replicas=2, gpus_per_replica=4)
    run_cycle_once()
    host.refresh_from_db()
    assert host.state == JobState.STARTING
    assert {t.node_id for t in Task.objects.filter(job=host)} <= {bare.pk, with_runc.pk}


def test_with_no_runtime_anywhere_an_image_job_waits_and_runs_once_an_agent_reports_one(org, ann):
    first, _ = make_cluster(nodes=2, leaves_per_spine=1)
    job = submit(org, ann, gpus_per_replica=1, image=IMAGE)
    run_cycle_once()
    job.refresh_from_db()
    assert (job.state, job.pending_reason) == (
        JobState.PENDING,
        "needs nodes that run containers: 0 of 2 H100 nodes have a runtime",
    )
    # The agent restarted with runc installed: its heartbeat says so (agent API), and the next cycle sees it
    # (the topology's cache key counts the nodes with a runtime).
    Node.objects.filter(pk=first.pk).update(container_runtime="runc")
    run_cycle_once()
    assert Job.objects.get(pk=job.pk).state == JobState.STARTING
    assert Task.objects.get(job=job).node_id == first.pk
