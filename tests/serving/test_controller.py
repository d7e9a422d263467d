"""The service controller over real PostgreSQL and the real scheduling cycle (docs/services.md)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from scheduling.cycle import enforce_time_limits
from scheduling.cycle_lease import lease_claim, lease_release
from scheduling.models import Job, JobKind, RolloutState, Service, ServiceState, ServiceWindow
from scheduling.serving.controller import AUTOSCALE_WINDOW_S, SURGE_WAIT_S
from scheduling.serving.selectors import replicas_of, window_s
from scheduling.serving.services import service_delete, service_update
from scheduling.states import JobState
from tenants.models import AuditEntry
from tests.serving.conftest import later, live, set_ready, start, tick

pytestmark = pytest.mark.django_db


def ready_count(service: Service) -> int:
    return sum(1 for r in replicas_of(service=service) if r.ready)


def test_a_new_service_gets_its_replicas_as_tier_1_jobs_with_no_time_limit(world):
    service = world.create(replicas=2)
    tick(service)
    jobs = live(service)
    assert len(jobs) == 2
    for job in jobs:
        assert (job.kind, job.tier, job.time_limit_s, job.service_revision, job.state) == (
            JobKind.SERVICE, 1, 0, 1, JobState.STARTING
        )  # fmt: skip
    for job in jobs:
        start(job)
    tick(service)
    service.refresh_from_db()
    assert ready_count(service) == 2
    assert service.rollout_state == RolloutState.COMPLETE
    # Ready replicas are never stopped for a time limit: they have none.
    lease = lease_claim()
    try:
        assert enforce_time_limits(lease=lease, now=later(400 * 24 * 3600)) == []
    finally:
        lease_release(lease)


def test_scaling_down_drains_the_not_ready_first_and_stops_them_after_the_drain(world):
    service = world.create(replicas=3)
    tick(service)
    a, b, c = live(service)
    for job in (a, b, c):
        start(job)
    set_ready(b, False)  # b fails its readiness probe: it serves nothing, so it goes first
    service = service_update(user=world.ann, service=service, changes={"replicas": 2})
    tick(service)
    b.refresh_from_db()
    assert b.stop_requested_at is not None  # not ready: nothing in flight, stopped at once
    service = service_update(user=world.ann, service=service, changes={"replicas": 1})
    tick(service)
    drained = [j for j in (a, c) if Job.objects.get(pk=j.pk).drain_started_at is not None]
    assert len(drained) == 1
    gone = Job.objects.get(pk=drained[0].pk)
    assert gone.stop_requested_at is None, "a ready replica is drained before it is stopped"
    assert ready_count(service) == 1, "a draining replica is out of the proxy's rotation at once"
    tick(service, at=later(settings.YARD["SERVICE_DRAIN_S"] + 1))
    gone.refresh_from_db()
    assert gone.stop_requested_at is not None and gone.stop_reason == "CANCELLED"


def test_a_rollout_surges_by_one_and_never_drops_below_the_wanted_ready_count(world):
    service = world.create(replicas=2)
    tick(service)
    for job in live(service):
        start(job)
    tick(service)
    service = service_update(user=world.ann, service=service, changes={"command": "serve --v2"})
    assert service.revision == 2 and service.rollout_state == RolloutState.PROGRESSING
    lowest = 2
    for _ in range(8):
        tick(service)
        lowest = min(lowest, ready_count(service))
        for job in live(service):
            if job.state == JobState.STARTING:
                start(job)
        lowest = min(lowest, ready_count(service))
        assert len([j for j in live(service) if j.drain_started_at is None and j.stop_requested_at is None]) <= 3  # surge one
    tick(service, at=later(settings.YARD["SERVICE_DRAIN_S"] + 1))
    service.refresh_from_db()
    current = [r for r in replicas_of(service=service) if not r.draining and not r.stopping]
    assert {r.revision for r in current} == {2} and len(current) == 2
    assert all(r.ready for r in current)
    assert lowest >= 2, "a surge rollout keeps every wanted replica ready"
    assert service.rollout_state == RolloutState.COMPLETE
    assert Job.objects.get(pk=current[0].job.pk).command == "serve --v2"


def test_a_rollout_that_never_gets_ready_rolls_back_without_touching_the_old_replicas(world):
    service = world.create(replicas=2, progress_deadline_s=30)
    tick(service)
    old = live(service)
    for job in old:
        start(job)
    tick(service)
    service = service_update(user=world.ann, service=service, changes={"image": "", "command": "serve --broken"})
    tick(service)
    new = [j for j in live(service) if j.service_revision == 2]
    assert len(new) == 1
    start(new[0], ready=False)  # it runs, but never answers its readiness probe
    tick(service, at=later(10))
    assert Service.objects.get(pk=service.pk).rollout_state == RolloutState.PROGRESSING
    tick(service, at=later(31))
    service.refresh_from_db()
    assert service.revision == 1 and service.rollout_state == RolloutState.ROLLED_BACK
    assert "progress deadline" in service.rollout_message
    assert Job.objects.get(pk=new[0].pk).stop_requested_at is not None
    for job in old:
        job.refresh_from_db()
        assert job.drain_started_at is None and job.stop_requested_at is None
    assert ready_count(service) == 2
    assert AuditEntry.objects.filter(action="service.rolled_back", object_id=str(service.pk)).count() == 1


def test_a_surge_with_no_room_drains_one_old_replica_after_a_while_keeping_replicas_minus_one_ready(world):
    # Two replicas of 8 GPUs (2 nodes x 4) fill team-a's guarantee of 16: a Tier 1 surge replica, admitted
    # only within the guarantee, cannot place.
    service = world.create(replicas=2, nodes_per_replica=2, gpus_per_node=4)
    tick(service)
    for job in live(service):
        start(job)
    service = service_update(user=world.ann, service=service, changes={"command": "serve --v2"})
    tick(service)
    surge = [j for j in live(service) if j.service_revision == 2]
    assert len(surge) == 1 and surge[0].state == JobState.PENDING
    tick(service, at=later(SURGE_WAIT_S / 2))
    assert ready_count(service) == 2
    tick(service, at=later(SURGE_WAIT_S + 1))
    assert ready_count(service) == 1, "one old replica makes room: replicas - 1 stay ready"


def test_autoscaling_follows_in_flight_requests_up_at_once_and_down_after_the_cooldown(world):
    service = world.create(replicas=1, min_replicas=1, max_replicas=4, target_inflight=2.0, scale_cooldown_s=60)
    tick(service)
    size = window_s()
    now = timezone.now()

    def load(inflight: float, at) -> None:
        """``inflight`` requests in flight on average over the autoscaler's whole window, ending now."""
        for i in range(int(AUTOSCALE_WINDOW_S / size)):
            start_at = at - timedelta(seconds=size * (i + 1.5))  # whole windows, ended, clear of the edges
            ServiceWindow.objects.create(
                service=service, start=start_at, source=f"test:{at.timestamp()}", requests=10, busy_s=inflight * size
            )

    load(5.0, now)
    tick(service)
    service.refresh_from_db()
    assert service.replicas == 3  # ceil(5 / 2)
    assert AuditEntry.objects.filter(action="service.autoscale", object_id=str(service.pk)).count() == 1
    assert len(live(service)) == 3
    ServiceWindow.objects.all().delete()
    load(0.5, later(20))
    tick(service, at=later(20))
    assert Service.objects.get(pk=service.pk).replicas == 3, "no scale-down within the cool-down"
    load(0.5, later(70))
    tick(service, at=later(70))
    assert Service.objects.get(pk=service.pk).replicas == 1


def test_deleting_drains_everything_and_frees_the_name_once_nothing_is_left(world):
    service = world.create(replicas=2)
    tick(service)
    jobs = live(service)
    for job in jobs:
        start(job)
    service_delete(user=world.ann, service=service)
    tick(service)
    assert ready_count(service) == 0
    tick(service, at=later(settings.YARD["SERVICE_DRAIN_S"] + 1))
    for job in jobs:
        job.refresh_from_db()
        assert job.stop_requested_at is not None
        Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED, ended_at=timezone.now())
    tick(service, at=later(settings.YARD["SERVICE_DRAIN_S"] + 2))
    assert Service.objects.get(pk=service.pk).state == ServiceState.DELETED
    again = world.create(replicas=1)
    assert again.pk != service.pk


def test_a_crash_looping_replica_is_told_once(world):
    service = world.create(replicas=1)
    tick(service)
    (job,) = live(service)
    start(job)
    from scheduling.models import Task

    Task.objects.filter(job=job, rank=0).update(service_crash_looping=True, service_restarts=4, service_message="exit 1")
    tick(service)
    tick(service)
    rows = AuditEntry.objects.filter(action="service.crash_loop", object_id=str(service.pk))
    assert rows.count() == 1 and "crash-looping" in rows.get().message


def test_a_crash_loop_and_a_rollback_notify_the_owner_and_the_teams_lead(world):
    from notifications.kinds import Kind
    from notifications.models import Notification
    from notifications.services import notifications_collect
    from tenants.models import Role
    from tests.factories import make_user

    make_user("lea", unit=world.org.team_a, role=Role.TEAM_LEAD)
    service = world.create(replicas=1, progress_deadline_s=30)
    tick(service)
    (job,) = live(service)
    start(job)
    tick(service)
    from scheduling.models import Task

    Task.objects.filter(job=job, rank=0).update(service_crash_looping=True, service_restarts=3, service_message="exit 1")
    tick(service)
    service = service_update(user=world.ann, service=service, changes={"command": "serve --broken"})
    tick(service)
    (new,) = [j for j in live(service) if j.service_revision == 2]
    start(new, ready=False)
    tick(service, at=later(31))
    notifications_collect(now=later(600))
    got = {(n.user.username, n.event.kind) for n in Notification.objects.select_related("user", "event")}
    assert {("ann", Kind.SERVICE_CRASH_LOOP), ("lea", Kind.SERVICE_CRASH_LOOP)} <= got
    assert {("ann", Kind.SERVICE_ROLLED_BACK), ("lea", Kind.SERVICE_ROLLED_BACK)} <= got


def test_a_replica_whose_node_is_lost_is_moved_to_another_node_and_the_others_keep_serving(world):
    from scheduling.models import Node, NodeState, Task
    from scheduling.services import node_mark_lost

    service = world.create(replicas=2, gpus_per_node=8)  # a whole node each
    tick(service)
    first, second = live(service)
    for job in (first, second):
        start(job)
    lost = Task.objects.get(job=first, rank=0).node
    assert Task.objects.get(job=second, rank=0).node_id != lost.pk
    Node.objects.filter(pk=lost.pk).update(state=NodeState.DOWN)
    node_mark_lost(node=Node.objects.get(pk=lost.pk), reason="test: node gone")
    first.refresh_from_db()
    assert (first.state, first.attempt) == (JobState.PENDING, 2)
    assert ready_count(service) == 1, "the other replica is not touched"
    tick(service)
    first.refresh_from_db()
    assert first.state == JobState.STARTING
    moved = Task.objects.get(job=first, attempt=2, rank=0)
    assert moved.node_id != lost.pk
    assert len(live(service)) == 2, "moved, not replaced by a second replica"
