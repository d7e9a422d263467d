import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduling.models import Allocation, Gpu, Task
from scheduling.services import StaleState, job_transition
from scheduling.states import IllegalTransition, JobState
from tests.factories import make_cluster, make_job, make_org, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def placed():
    org = make_org()
    user = make_user("ann", unit=org.team_a)
    nodes = make_cluster(nodes=2)
    job_a = make_job(team=org.team_a, user=user)
    job_b = make_job(team=org.team_a, user=user)
    gpu = Gpu.objects.filter(node=nodes[0]).first()
    task_a = Task.objects.create(job=job_a, attempt=1, rank=0, node=nodes[0])
    task_b = Task.objects.create(job=job_b, attempt=1, rank=0, node=nodes[0])
    return gpu, (job_a, task_a), (job_b, task_b)


def test_second_live_allocation_of_a_gpu_is_rejected_by_the_database(placed):
    gpu, (job_a, task_a), (job_b, task_b) = placed
    Allocation.objects.create(gpu=gpu, task=task_a, job=job_a, attempt=1)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(gpu=gpu, task=task_b, job=job_b, attempt=1)


def test_released_allocation_frees_the_gpu_for_another(placed):
    gpu, (job_a, task_a), (job_b, task_b) = placed
    first = Allocation.objects.create(gpu=gpu, task=task_a, job=job_a, attempt=1)
    Allocation.objects.filter(pk=first.pk).update(released_at=timezone.now())
    Allocation.objects.create(gpu=gpu, task=task_b, job=job_b, attempt=1)
    assert Allocation.objects.filter(gpu=gpu, released_at__isnull=True).count() == 1


@pytest.mark.parametrize(
    ("start", "target"),
    [
        (JobState.PENDING, JobState.RUNNING),
        (JobState.PENDING, JobState.COMPLETED),
        (JobState.COMPLETED, JobState.PENDING),
        (JobState.CANCELLED, JobState.RUNNING),
        (JobState.RUNNING, JobState.PENDING),
        (JobState.PREEMPTED, JobState.RUNNING),
    ],
)
def test_illegal_job_transition_raises_and_changes_nothing(start, target):
    org = make_org()
    job = make_job(team=org.team_a, user=make_user("ann"), state=start)
    with pytest.raises(IllegalTransition, match=f"{start} → {target} is not allowed"):
        job_transition(job=job, to=target, reason="test")
    job.refresh_from_db()
    assert job.state == start
    assert not job.events.exists()


def test_legal_transition_records_an_event_with_reason_and_actor():
    org = make_org()
    user = make_user("ann")
    job = make_job(team=org.team_a, user=user)
    job_transition(job=job, to=JobState.CANCELLED, reason="user cancelled", actor=user)
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED and job.ended_at is not None
    event = job.events.get()
    assert (event.from_state, event.to_state, event.reason, event.actor) == ("PENDING", "CANCELLED", "user cancelled", user)


def test_transition_from_a_stale_read_is_refused():
    org = make_org()
    job = make_job(team=org.team_a, user=make_user("ann"))
    stale = type(job).objects.get(pk=job.pk)
    job_transition(job=job, to=JobState.CANCELLED, reason="first")
    with pytest.raises(StaleState):
        job_transition(job=stale, to=JobState.STARTING, reason="second")
