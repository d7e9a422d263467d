"""Two distributed jobs whose rank 0 land on one node each meet on their own rendezvous port.

Real agents, real processes, real sockets: rank 0 listens on MASTER_ADDR:MASTER_PORT, rank 1 connects
and both exchange their job's id. With one port for every job (as before), the second rank 0 failed
with EADDRINUSE and its rank 1 joined the other job's rendezvous.
"""

from __future__ import annotations

import pytest

from scheduling.cycle import run_cycle_once
from scheduling.states import JobState
from tests.e2e.conftest import Harness, script

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

RENDEZVOUS = """
import os, socket, sys, time
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank, job = int(os.environ["RANK"]), os.environ["YARD_JOB_ID"]
if rank == 0:
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TCPStore: over TIME_WAIT, not a listener
    server.bind((addr, port))          # EADDRINUSE here if two gangs share a port
    server.listen(1)
    server.settimeout(60)
    peer, _ = server.accept()
    theirs = peer.recv(64).decode()
    peer.sendall(job.encode())
    print("rank 0 of job", job, "on port", port, "met", theirs, flush=True)
    sys.exit(0 if theirs == job else 3)
deadline = time.time() + 60
while True:
    try:
        conn = socket.create_connection((addr, port), timeout=2)
        break
    except OSError:
        if time.time() > deadline:
            sys.exit(4)
        time.sleep(0.2)
conn.sendall(job.encode())
theirs = conn.recv(64).decode()
print("rank 1 of job", job, "met", theirs, "on port", port, flush=True)
sys.exit(0 if theirs == job else 5)
"""


@pytest.mark.usefixtures("free_rendezvous_ports")
def test_two_gangs_packed_on_one_node_rendezvous_on_ports_of_their_own(harness: Harness) -> None:
    harness.start_agent("rdv-a", gpus=8)
    harness.node_ready("rdv-a")
    command = script(harness.root, "rendezvous", RENDEZVOUS)
    first = harness.submit("gang-1", command, replicas=2, gpus_per_replica=1)
    second = harness.submit("gang-2", command, replicas=2, gpus_per_replica=1)
    placed = run_cycle_once().placed
    assert sorted(placed) == sorted([first.pk, second.pk])
    ports = {job.pk: {t.master_port for t in harness.tasks(job)} for job in (first, second)}
    assert all(len(p) == 1 for p in ports.values()) and ports[first.pk] != ports[second.pk]
    assert {t.node.name for job in (first, second) for t in harness.tasks(job)} == {"rdv-a"}  # packed on one node
    done = [harness.job_in(job, JobState.COMPLETED, JobState.FAILED, timeout=60) for job in (first, second)]
    print(f"two 2-rank gangs on one node: ports {sorted(p.pop() for p in ports.values())}, states {[j.state for j in done]}")
    assert [j.state for j in done] == [JobState.COMPLETED, JobState.COMPLETED], [j.pending_reason or j.exit_code for j in done]
