"""The job page's placement shows each node's ranks' real CPU and memory use beside what they were given."""

from __future__ import annotations

from django.urls import reverse

from scheduling.models import Allocation, Gpu, Task
from scheduling.states import JobState
from tests.factories import make_job


def _job_on_two_nodes(cast):
    job = make_job(
        team=cast.org.team_a, user=cast.ann, state=JobState.RUNNING, replicas=2, gpus_per_replica=1,
        cpus_per_replica=4, memory_mb_per_replica=16384,
    )  # fmt: skip
    nodes = sorted({g.node for g in Gpu.objects.select_related("node")}, key=lambda n: n.name)[:2]
    tasks = []
    for rank, node in enumerate(nodes):
        task = Task.objects.create(job=job, attempt=1, rank=rank, node=node, state="RUNNING")
        Allocation.objects.create(gpu=Gpu.objects.filter(node=node).order_by("index").first(), task=task, job=job, attempt=1)
        tasks.append(task)
    return job, tasks


def test_the_placement_shows_cpu_and_memory_used_of_given(client, cast):
    job, (first, _second) = _job_on_two_nodes(cast)
    Task.objects.filter(pk=first.pk).update(cpu_used=3.2, memory_used_mb=12390.4, memory_peak_mb=14336.0)
    client.force_login(cast.ann)
    body = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "CPU 3.2 of 4 cores" in body
    assert "Memory 12.1 of 16 GiB, peak 14.0" in body
    # The other node's rank has reported nothing yet.
    assert "CPU —" in body and "Memory —" in body


def test_a_small_process_reads_in_mib_and_the_spec_says_what_each_replica_was_given(client, cast):
    job, (first, _second) = _job_on_two_nodes(cast)
    Task.objects.filter(pk=first.pk).update(cpu_used=0.0, memory_used_mb=180.4, memory_peak_mb=200.0)
    client.force_login(cast.ann)
    body = client.get(reverse("job", args=[job.pk])).content.decode()
    assert "Memory 180 MiB of 16 GiB, peak 200 MiB" in body
    assert "4 CPU cores, 16 GiB" in body
