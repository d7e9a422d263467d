"""Property-based fuzzing of every /api/v1/ operation from the OpenAPI schema, with every schemathesis check,
positive and negative data, and stateful runs that follow the schema's links (a job's id to its detail,
cancel, logs, rerun): no input makes a 5xx, and server and schema agree on what is valid.

Bounded for CI: a fixed number of examples per operation (derandomized, so a run is repeatable) and a few
short stateful scenarios. The schema is generated in-process (what /api/schema/ serves) and requests go
through the real WSGI app, authenticated with a team lead's token, against a small cluster with a few jobs.

One check is narrowed, not dropped: a request the schema calls valid may still be refused for what no
schema can say (the team does not exist or is not the caller's, the job can never fit this cluster, a
checkpoint directory outside the team's own, an environment variable name, a job file whose text is
wrong). Those answers must be a 400 that names exactly those fields (or never_runnable); any other
refusal of schema-valid data fails the run.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from django.core import signals
from django.db import close_old_connections
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck
from hypothesis import settings as hsettings
from schemathesis.openapi.checks import RejectedPositiveData
from schemathesis.specs.openapi.checks import positive_data_acceptance

from portal.wsgi import application
from scheduling.models import Task, TaskLogChunk
from scheduling.states import JobState
from tenants.models import Role
from tenants.services import token_create_personal
from tests.factories import make_cluster, make_job, make_org, make_user

schema = schemathesis.openapi.from_dict(SchemaGenerator().get_schema(request=None, public=True))
schema.app = application
schema = schema.include(path_regex=r"^/api/v1/")

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
EXAMPLES = 25  # per operation and mode: the CI budget
FUZZ = hsettings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
# What a schema cannot say; a refusal of schema-valid data must name only these.
# A unit whose registry credentials the caller manages, a registry's port range, an image reference (and the
# deployment's allow-list), mounts and working directory in the container are the server's to check too.
DOMAIN_FIELDS = {"team", "checkpoint_dir", "env", "gpu_type", "non_field_errors", "unit", "registry"}
DOMAIN_FIELDS |= {"image", "container_mounts", "container_workdir"}
# A service: its name taken in its team, min <= replicas <= max across fields, a command where no image
# has an entry point, and a replica's shape against the cluster's nodes and the team's quota.
DOMAIN_FIELDS |= {"name", "command", "replicas", "max_replicas", "nodes_per_replica", "gpus_per_node"}
DOMAIN_FIELDS |= {"cpus_per_node", "memory_mb_per_node", "revision"}
# An SSH public key: its base64 must decode to a key of the type it names, not one the caller has already
# (tenants/services.py, ssh_key_parse).
DOMAIN_FIELDS |= {"public_key"}
# A job array's indices (scheduling/arrayspec.py): ranges run upwards, %N is at least 1, no index reaches the
# deployment's YARD_MAX_ARRAY_SIZE.
DOMAIN_FIELDS |= {"array"}


def positive_data_acceptance_within_the_domain(ctx: Any, response: Any, case: Any) -> bool | None:
    """schemathesis' positive_data_acceptance, except for the refusals that need the database to decide."""
    try:
        return positive_data_acceptance(ctx, response, case)
    except RejectedPositiveData:
        if response.status_code != 400 or "json" not in response.headers.get("content-type", [""])[0]:
            raise
        body = response.json()
        if body.get("code") == "never_runnable":
            return None
        if (isinstance(case.body, dict) and "format" in case.body) or not (case.media_type or "").endswith("json"):
            return None  # a job file's own text, translated on the server (its errors name its lines)
        if body.get("code") == "invalid" and body.get("fields") and set(body["fields"]) <= DOMAIN_FIELDS:
            return None
        raise


@pytest.fixture
def _keep_the_test_transaction():
    # The real WSGI handler closes "old" connections at each request's start and end, which would
    # close the connection holding the test's transaction; Django's test client does the same.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)


@pytest.fixture
def bearer(settings, _keep_the_test_transaction):
    settings.ALLOWED_HOSTS = ["localhost", "testserver"]
    org = make_org()
    lead = make_user("lea", unit=org.team_a, role=Role.TEAM_LEAD)
    node = make_cluster(nodes=4)[0]
    for state in (JobState.PENDING, JobState.RUNNING, JobState.COMPLETED):
        job = make_job(team=org.team_a, user=lead, state=state, started_at=timezone.now())
        task = Task.objects.create(job=job, attempt=1, rank=0, node=node)
        TaskLogChunk.objects.create(task=task, offset=0, data="hello\nworld\n")
    make_job(team=org.team_c, user=make_user("bea", unit=org.team_c))
    return {"Authorization": f"Bearer {token_create_personal(user=lead, name='fuzz', expires_at=None).raw}"}


@schema.parametrize()
@FUZZ
def test_no_input_makes_a_server_error_or_an_answer_the_schema_does_not_allow(case, bearer):
    case.call_and_validate(
        headers=bearer,
        excluded_checks=[positive_data_acceptance],
        additional_checks=[positive_data_acceptance_within_the_domain],
    )


def test_stateful_sequences_along_the_schemas_links_keep_the_contract(bearer):
    class Workflow(schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: Any) -> dict[str, Any]:
            return {"headers": bearer}

        def validate_response(self, response: Any, case: Any, additional_checks: Any = None, **kwargs: Any) -> None:
            case.validate_response(
                response,
                headers=bearer,  # the credentials are ours, not generated ones
                excluded_checks=[positive_data_acceptance],
                additional_checks=[positive_data_acceptance_within_the_domain],
                transport_kwargs=kwargs,
            )

    Workflow.run(
        settings=hsettings(
            max_examples=10, stateful_step_count=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
        )
    )


def test_the_schema_links_a_created_job_to_what_can_be_done_with_it():
    raw = SchemaGenerator().get_schema(request=None, public=True)
    links = raw["paths"]["/api/v1/jobs"]["post"]["responses"]["201"]["links"]
    assert {"jobs_retrieve", "jobs_cancel", "jobs_logs", "jobs_rerun"} <= set(links)


def test_fuzzing_requests_reach_the_views_authenticated(bearer):
    response = schema["/api/v1/me"]["GET"].Case().call(headers=bearer)
    assert response.status_code == 200 and response.json()["username"] == "lea"
