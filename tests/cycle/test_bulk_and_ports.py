"""Placements written in bulk, each gang with its own rendezvous port, and failover of the cycle lease."""

from __future__ import annotations

import os
import time

import pytest
from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.test import override_settings
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from scheduling import cycle_lease
from scheduling.core.plan import plan
from scheduling.cycle import apply_plan, run_cycle_once
from scheduling.cycle_lease import lease_claim, lease_release
from scheduling.models import Allocation, Job, Node, Task
from scheduling.selectors import invariant_violations, snapshot_build
from scheduling.services import JobSpec, job_request_stop, job_submit, task_mark_exited
from scheduling.states import JobState, TaskState
from tenants.models import AuditEntry

pytestmark = pytest.mark.django_db


def submit(org, user, **kw):
    kw.setdefault("command", "true")
    return job_submit(user=user, spec=JobSpec(name="train", team=kw.pop("team", org.team_a), **kw))


def test_small_gangs_on_one_node_get_ports_of_their_own(org, ann, nodes):
    jobs = [submit(org, ann, replicas=2, gpus_per_replica=1) for _ in range(4)]
    result = run_cycle_once()
    assert sorted(result.placed) == sorted(j.pk for j in jobs)
    masters = list(Task.objects.filter(rank=0).values_list("node_id", "master_port"))
    assert len(set(masters)) == len(masters)  # no two live gangs share a (node, port)
    low, high = settings.YARD["RENDEZVOUS_PORTS"]
    assert all(low <= port <= high for _, port in masters)
    for job in jobs:  # every rank of a gang gets its rank 0's port
        assert len(set(Task.objects.filter(job=job).values_list("master_port", flat=True))) == 1


def test_the_database_refuses_a_second_live_gang_on_a_port(org, ann, nodes):
    first, second = (submit(org, ann, replicas=1, gpus_per_replica=1) for _ in range(2))
    run_cycle_once()
    t1 = Task.objects.get(job=first)
    t2 = Task.objects.get(job=second)
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.filter(pk=t2.pk).update(node=t1.node, master_addr=t1.master_addr, master_port=t1.master_port)


def test_a_requeued_job_keeps_its_port_when_it_is_free(org, ann, nodes):
    job = submit(org, ann, replicas=1, gpus_per_replica=8)
    run_cycle_once()
    task = Task.objects.get(job=job)
    port = task.master_port
    job_request_stop(job=Job.objects.get(pk=job.pk), reason="PREEMPTED", actor_label="test")
    task_mark_exited(task=task, exit_code=None, signal=15, stopped_by="sigterm", ended_at=timezone.now())
    assert Job.objects.get(pk=job.pk).attempt == 2
    run_cycle_once()
    assert Task.objects.get(job=job, attempt=2).master_port == port


@override_settings(YARD={**settings.YARD, "RENDEZVOUS_PORTS": (30000, 30001)})
def test_a_node_out_of_ports_says_so_and_the_job_waits(org, ann, db):
    from tests.factories import make_cluster

    make_cluster(nodes=1)
    jobs = [submit(org, ann, replicas=1, gpus_per_replica=1) for _ in range(3)]
    result = run_cycle_once()
    assert len(result.placed) == 2
    waiting = Job.objects.get(pk=(set(j.pk for j in jobs) - set(result.placed)).pop())
    assert waiting.state == JobState.PENDING
    assert "rendezvous port" in waiting.pending_reason and "YARD_RENDEZVOUS_PORTS" in waiting.pending_reason


def test_a_thousand_placements_take_a_fixed_number_of_statements_per_batch(db):
    from tests.factories import make_shared_cluster

    ((user, team),) = make_shared_cluster(125, teams=1)  # 1,000 GPUs, one team guaranteed them all
    # A real cluster: an address per node (the demo's 127.0.0.1 for all would share one port range).
    for i, pk in enumerate(Node.objects.values_list("pk", flat=True)):
        Node.objects.filter(pk=pk).update(address=f"10.1.{i // 250}.{i % 250 + 1}")
    for _ in range(1000):
        job_submit(user=user, spec=JobSpec(name="one", team=team, replicas=1, gpus_per_replica=1, command="true"))
    now = timezone.now()
    snapshot = snapshot_build(now=now)
    plan_ = plan(snapshot, now=now.timestamp())
    assert len(plan_.placements) == 1000
    lease = lease_claim()
    assert lease is not None
    with CaptureQueriesContext(connection) as queries:
        result = apply_plan(lease=lease, snapshot=snapshot, plan_=plan_, now=now)
    lease_release(lease)
    assert len(result.placed) == 1000 and result.conflicts == []
    # Two batches of 500 gangs, each about ten statements: not thousands of per-gang round trips.
    assert len(queries) < 60, len(queries)
    assert Task.objects.filter(state=TaskState.ASSIGNED).count() == 1000
    assert Allocation.objects.filter(released_at__isnull=True).count() == 1000
    assert AuditEntry.objects.filter(action="job.place").count() == 1000
    assert Job.objects.filter(state=JobState.STARTING).count() == 1000
    assert invariant_violations() == []


def test_a_batch_with_one_conflicting_gang_places_the_others(org, ann, nodes):
    jobs = [submit(org, ann, replicas=1, gpus_per_replica=8) for _ in range(3)]
    now = timezone.now()
    snapshot = snapshot_build(now=now)
    plan_ = plan(snapshot, now=now.timestamp())
    assert len(plan_.placements) == 3
    # A late write of an older holder took the GPUs of the second gang meanwhile.
    victim = plan_.placements[1]
    intruder = submit(org, ann, replicas=1, gpus_per_replica=1)
    Job.objects.filter(pk=intruder.pk).update(state=JobState.STARTING)
    node = Task.objects.none()
    from scheduling.models import Gpu, Node

    node = Node.objects.get(name=victim.nodes[0])
    task = Task.objects.create(job=intruder, attempt=1, rank=0, node=node, state=TaskState.ASSIGNED, master_port=None)
    Allocation.objects.create(gpu=Gpu.objects.get(pk=int(victim.replicas[0][0])), task=task, job=intruder, attempt=1)
    lease = lease_claim()
    assert lease is not None
    result = apply_plan(lease=lease, snapshot=snapshot, plan_=plan_, now=now)
    lease_release(lease)
    assert result.conflicts == [int(victim.job_id)]
    assert sorted(result.placed) == sorted(j.pk for j in jobs if j.pk != int(victim.job_id))
    assert Job.objects.get(pk=int(victim.job_id)).state == JobState.PENDING
    assert not Task.objects.filter(job_id=int(victim.job_id)).exists()


@pytest.mark.django_db(transaction=True)
def test_a_holder_whose_session_is_gone_frees_the_cycle_at_once(org, ann, nodes, monkeypatch):
    """kill -9 of a holder closes its database session: its session lock goes with it, so another
    worker claims at once instead of waiting out the lease (tests/faults measures it with real workers)."""
    if connection.vendor != "postgresql":
        pytest.skip("session locks are PostgreSQL's")
    import psycopg

    # A key of this test's own: the mechanism is what is tested, and no other session of the suite
    # (a live server's thread, an earlier test's connection) can hold it.
    key = 0x59410000 + os.getpid() % 0xFFFF
    monkeypatch.setattr(cycle_lease, "ADVISORY_KEY", key)
    s = connection.settings_dict
    dead = psycopg.connect(
        host=s["HOST"] or "127.0.0.1", port=s["PORT"] or 5432, user=s["USER"], dbname=s["NAME"], autocommit=True
    )
    dead.execute("SELECT pg_advisory_lock(%s)", [key])
    from scheduling.models import SchedulerLease

    SchedulerLease.objects.update_or_create(
        name="cycle", defaults={"holder": "dead-holder", "expires_at": timezone.now() + timezone.timedelta(minutes=5)}
    )
    assert lease_claim() is None  # the holder's session holds the lock, its lease runs: no takeover
    dead.close()  # the holder dies: its session, and its lock, are gone
    # The server ends the closed session's backend a moment after the client hangs up (on a loaded
    # machine, after the next statement has run): the claim must succeed within seconds, long before
    # the dead holder's five-minute lease runs out.
    deadline = time.monotonic() + 20
    while (lease := lease_claim()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lease is not None and lease.locked
    lease_release(lease)


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_fails_midway_gives_its_session_lock_back(org, ann, nodes, monkeypatch):
    """A database error inside the claim must not leave this (live) connection holding the cycle's
    session lock: every other worker would be shut out of the cycle until this process exits."""
    if connection.vendor != "postgresql":
        pytest.skip("session locks are PostgreSQL's")
    from django.db.models.query import QuerySet

    monkeypatch.setattr(cycle_lease, "ADVISORY_KEY", 0x59420000 + os.getpid() % 0xFFFF)  # this test's own key

    def broken(self, **kwargs):
        raise DatabaseError("the database went away mid-claim")

    with monkeypatch.context() as patched:
        patched.setattr(QuerySet, "update", broken)
        with pytest.raises(DatabaseError):
            lease_claim()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        assert cursor.fetchone()[0] == 0
    lease = lease_claim()
    assert lease is not None and lease.locked
    lease_release(lease)


def test_nodes_that_share_an_address_never_give_two_live_gangs_one_port(org, ann, nodes):
    """Simulated nodes on one host all have 127.0.0.1: the rendezvous store binds every interface, so a
    port is taken for all of them once one gang's rank 0 holds it on any of them."""
    Node.objects.update(address="127.0.0.1")
    # 2-node gangs (one replica a node): their rank 0 land on several nodes of the one address.
    jobs = [submit(org, ann, replicas=2, gpus_per_replica=4, one_per_node=True) for _ in range(4)]
    assert sorted(run_cycle_once().placed) == sorted(j.pk for j in jobs)
    masters = list(Task.objects.filter(rank=0).select_related("node"))
    assert len({t.node_id for t in masters}) > 1  # per node, some of them could have reused a port
    assert {t.master_addr for t in masters} == {"127.0.0.1"}
    ports = [t.master_port for t in masters]
    assert len(set(ports)) == len(ports) == 4, ports  # one port space for the one address
    for job in jobs:  # every rank of a gang gets its rank 0's address and port
        assert len(set(Task.objects.filter(job=job).values_list("master_addr", "master_port"))) == 1


def test_nodes_with_addresses_of_their_own_may_each_use_the_first_port(org, ann, nodes):
    for i, pk in enumerate(Node.objects.order_by("pk").values_list("pk", flat=True)):
        Node.objects.filter(pk=pk).update(address=f"10.0.0.{i + 1}")
    jobs = [submit(org, ann, replicas=2, gpus_per_replica=4, one_per_node=True) for _ in range(4)]
    assert sorted(run_cycle_once().placed) == sorted(j.pk for j in jobs)
    masters = list(Task.objects.filter(rank=0).select_related("node"))
    assert all(t.master_addr == t.node.address for t in masters)
    by_addr: dict[str, list[int]] = {}
    for t in masters:
        by_addr.setdefault(t.master_addr, []).append(t.master_port)
    assert all(len(set(p)) == len(p) for p in by_addr.values()), by_addr  # unique at each address
    low = settings.YARD["RENDEZVOUS_PORTS"][0]
    assert sum(low in p for p in by_addr.values()) > 1, by_addr  # and reused across addresses


def test_the_database_refuses_a_second_live_gang_on_a_port_of_one_address(org, ann, nodes):
    first, second = (submit(org, ann, replicas=1, gpus_per_replica=8) for _ in range(2))
    run_cycle_once()
    t1, t2 = Task.objects.get(job=first), Task.objects.get(job=second)
    assert t1.node_id != t2.node_id
    # Another node, same address, same port: refused, as on one node.
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.filter(pk=t2.pk).update(master_addr=t1.master_addr, master_port=t1.master_port)
    # Another address may hold the same port.
    Task.objects.filter(pk=t2.pk).update(master_addr="10.9.9.9", master_port=t1.master_port)


def test_a_live_gang_holds_its_port_at_the_address_its_node_has_now(org, ann, nodes):
    """A node re-registered with a new address still runs its gang's store on that port: a gang placed
    at the new address must not be given it."""
    first = submit(org, ann, replicas=1, gpus_per_replica=8)
    run_cycle_once()
    held = Task.objects.get(job=first)
    Node.objects.update(address="10.9.0.1")  # every node, the first gang's among them, now at one address
    assert held.master_addr != "10.9.0.1"
    second = submit(org, ann, replicas=1, gpus_per_replica=8)
    assert run_cycle_once().placed == [second.pk]
    task = Task.objects.get(job=second)
    assert task.node_id != held.node_id and task.master_addr == "10.9.0.1"
    assert task.master_port != held.master_port
