"""Three concurrent 2-node gangs on simulated nodes that share one address each meet only their own ranks.

Real agents, real processes, real sockets. Every simulated node has 127.0.0.1, and a rendezvous store
binds every interface, so the nodes share one port space: with ports unique per rank-0 *node* (as
before), the three gangs, their rank 0 on three nodes, all got 127.0.0.1:29500: one rank 0 bound it,
the others died with EADDRINUSE, and ranks of other jobs joined the one store (a sum of job ids showed
it). Each rank all-reduces its job id (tests/faults/data/allreduce.py): the sum must be job id x 2. The
rank-0 stores stay open until every gang has reduced, so the gangs overlap, as jobs that train do.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scheduling.cycle import run_cycle_once
from scheduling.models import Job
from scheduling.states import JobState
from tests.e2e.conftest import Harness, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ALLREDUCE = Path(__file__).parent / "data" / "allreduce.py"
NODES = [f"same-addr-{i}" for i in range(6)]


@pytest.mark.usefixtures("free_rendezvous_ports")
def test_three_two_node_gangs_on_one_address_each_sum_only_their_own_job_ids(harness: Harness) -> None:
    for name in NODES:  # one GPU a node: each gang takes two nodes, and their rank 0 three nodes
        harness.start_agent(name, gpus=1)
    nodes = [harness.node_ready(name) for name in NODES]
    assert {n.address for n in nodes} == {"127.0.0.1"}
    command = f"exec {sys.executable} {ALLREDUCE}"
    jobs = [harness.submit(f"allreduce-{i}", command, replicas=2, gpus_per_replica=1) for i in range(3)]
    assert sorted(run_cycle_once().placed) == sorted(j.pk for j in jobs)
    tasks = {job.pk: harness.tasks(job) for job in jobs}
    assert len({t.node_id for ts in tasks.values() for t in ts}) == 6  # six nodes, one address
    rendezvous = {job_id: {(t.master_addr, t.master_port) for t in ts} for job_id, ts in tasks.items()}
    print(f"three 2-node gangs at one address: rendezvous {rendezvous}")
    assert all(len(r) == 1 for r in rendezvous.values())  # every rank of a gang gets its rank 0's

    def settled(job: Job) -> bool:  # every rank reduced, or the gang ended (a rank died)
        if all((harness.root / f"allreduce-{job.pk}-{rank}.txt").exists() for rank in range(2)):
            return True
        return Job.objects.get(pk=job.pk).state in (JobState.FAILED, JobState.COMPLETED)

    wait_for("every gang reduced or ended", lambda: all(settled(job) for job in jobs), timeout=120)
    (harness.root / "release").touch()  # now the rank-0 stores may close, all having overlapped
    done = [harness.job_in(job, JobState.COMPLETED, JobState.FAILED, timeout=120) for job in jobs]
    sums: dict[tuple[int, int], str] = {}
    for job in jobs:
        for rank in range(2):
            path = harness.root / f"allreduce-{job.pk}-{rank}.txt"
            sums[(job.pk, rank)] = path.read_text().strip() if path.exists() else "none (the rank died)"
    print(f"states {[j.state for j in done]}, sums {sums}")
    assert sums == {(job.pk, rank): str(job.pk * 2) for job in jobs for rank in range(2)}, sums
    assert [j.state for j in done] == [JobState.COMPLETED] * 3, [j.exit_code for j in done]
    assert wait_for("no workload left", lambda: not harness.workload_pids(), timeout=30)
