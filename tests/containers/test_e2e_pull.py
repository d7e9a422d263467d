"""A job's image through the portal and a real agent (issue 26): a pull that fails fails the job with the
registry's answer (IMAGE_PULL, not requeued), and a private registry's image is pulled with the team's
registry credential, sealed in the portal and opened only into the task spec.

Live server, the cycle run in-process, a real ``python -m nodeagent`` with one simulated GPU, Debian's
docker-registry on loopback (one open, one behind htpasswd).
"""

from __future__ import annotations

import pytest

from scheduling.models import Job
from scheduling.registry_credentials import credential_set
from scheduling.states import JobState
from tenants.models import Role
from tests.containers.conftest import PASSWORD, USER, Registry, auth_registry, build_image, image, registry  # noqa: F401
from tests.e2e.conftest import Harness, harness, wait_for  # noqa: F401  (fixtures used here)
from tests.factories import make_user

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="session")
def private_image(auth_registry: Registry, tmp_path_factory: pytest.TempPathFactory) -> str:  # noqa: F811
    reference = auth_registry.ref("private")
    build_image(
        tmp_path_factory.mktemp("private-image"),
        reference,
        env={},
        cmd=["/bin/sh", "-c", "true"],
        creds=f"{USER}:{PASSWORD}",
    )
    return reference


def _one_node(harness: Harness) -> None:  # noqa: F811
    harness.start_agent("ct-pull", gpus=1)
    harness.node_ready("ct-pull")


def test_an_image_that_is_not_there_fails_the_job_with_the_registrys_answer(harness: Harness, registry: Registry) -> None:  # noqa: F811
    _one_node(harness)
    missing = registry.ref("no-such-image")
    job = harness.submit("missing-image", "true", gpus_per_replica=1, image=missing)
    harness.place(job)
    failed = harness.job_in(job, JobState.FAILED, JobState.PENDING, timeout=60)
    assert (failed.state, failed.stop_reason, failed.attempt) == (JobState.FAILED, "IMAGE_PULL", 1)
    assert "no such image" in failed.stop_message and missing in failed.stop_message
    assert any("no such image" in e.reason for e in failed.events.all())


def test_a_private_image_is_pulled_with_the_teams_credential(harness: Harness, private_image: str) -> None:  # noqa: F811
    _one_node(harness)
    lead = make_user("lead", unit=harness.org.team_a, role=Role.TEAM_LEAD)
    registry_host = private_image.split("/", 1)[0]

    refused = harness.submit("no-credential", "true", gpus_per_replica=1, image=private_image)
    harness.place(refused)
    ended = harness.job_in(refused, JobState.FAILED, JobState.COMPLETED, timeout=60)
    assert (ended.state, ended.stop_reason) == (JobState.FAILED, "IMAGE_PULL")
    assert "refused the credentials" in ended.stop_message

    # The department's credential serves every team below it.
    credential_set(actor=lead, unit=harness.org.dept, registry=registry_host, username=USER, password=PASSWORD)
    pulled = harness.submit("with-credential", "echo ran-in-the-private-image", gpus_per_replica=1, image=private_image)
    harness.place(pulled)
    done = harness.job_in(pulled, JobState.COMPLETED, JobState.FAILED, timeout=90)
    assert done.state == JobState.COMPLETED, (done.stop_reason, done.stop_message, [e.reason for e in done.events.all()])
    assert PASSWORD not in harness.agent_log("ct-pull")
    assert Job.objects.filter(stop_message__contains=PASSWORD).count() == 0
