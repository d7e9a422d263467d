"""The reaper's warning reaches the owner on every page, and nobody else."""

import pytest
from django.utils import timezone

from scheduling.models import JobKind
from scheduling.states import JobState
from tests.factories import make_job, make_org, make_user

pytestmark = pytest.mark.django_db

BANNER = "has not used its GPUs for a while"


@pytest.fixture
def warned_notebook():
    org = make_org()
    owner = make_user("nora", unit=org.team_a)
    other = make_user("otto", unit=org.team_a)
    job = make_job(
        team=org.team_a,
        user=owner,
        name="my-notebook",
        kind=JobKind.NOTEBOOK,
        state=JobState.RUNNING,
        idle_warned_at=timezone.now(),
    )
    return job, owner, other


@pytest.mark.parametrize("path", ["/", "/jobs/"])
def test_owner_sees_the_idle_warning_on_their_pages(client, warned_notebook, path):
    _, owner, _ = warned_notebook
    client.force_login(owner)
    body = client.get(path).content.decode()
    assert BANNER in body and "my-notebook" in body


def test_a_team_mate_does_not_see_the_owners_warning(client, warned_notebook):
    _, _, other = warned_notebook
    client.force_login(other)
    assert BANNER not in client.get("/").content.decode()


def test_no_banner_once_the_notebook_is_no_longer_warned(client, warned_notebook):
    job, owner, _ = warned_notebook
    type(job).objects.filter(pk=job.pk).update(idle_warned_at=None)
    client.force_login(owner)
    assert BANNER not in client.get("/").content.decode()
