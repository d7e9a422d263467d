"""Every API operation x tenant A's session, personal token and CI token x tenant B's objects and unknown ids:
zero 2xx answers and zero database changes. An operation missing from MATRIX fails the completeness test."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from scheduling.models import (
    Allocation,
    Job,
    JobArray,
    JobEvent,
    JobKind,
    RegistryCredential,
    Service,
    ServiceToken,
    Task,
    TaskLogChunk,
)
from scheduling.services import JobSpec, job_array_submit
from scheduling.states import JobState
from tenants.models import ApiToken, AuditEntry, Membership, OrgUnit, Quota, SshKey
from tenants.services import ssh_key_add
from tests.api.conftest import session_client, token_client
from tests.factories import make_cluster, make_job

pytestmark = pytest.mark.django_db

UNKNOWN = 987654321
# A real public key (ssh-keygen -t ed25519), tenant B's.
ED25519 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJeydCn38sbRTRwmOmdrcmDOENk2ojY+o9EBHo+Chbsn bea@laptop"


@dataclass
class Target:
    job: int
    notebook: int
    team: int
    team_slug: str
    credential: int = UNKNOWN
    service: int = UNKNOWN
    service_token: int = UNKNOWN
    dev_session: int = UNKNOWN
    ssh_key: int = UNKNOWN
    array: int = UNKNOWN


@dataclass
class Call:
    method: str
    path: str
    data: dict[str, Any] | None = None


def _job_body(t: Target) -> dict[str, Any]:
    return {"name": "x", "team": t.team_slug, "replicas": 1, "gpus_per_replica": 1}


# operation (method and path, as in the schema) -> the request that would touch tenant B's object (or an unknown one)
MATRIX: dict[str, Callable[[Target], Call]] = {
    "GET /api/v1/jobs": lambda t: Call("get", "/api/v1/jobs", {"team": t.team_slug}),
    "POST /api/v1/jobs": lambda t: Call("post", "/api/v1/jobs", _job_body(t)),
    "GET /api/v1/jobs/{id}": lambda t: Call("get", f"/api/v1/jobs/{t.job}"),
    "POST /api/v1/jobs/{id}/cancel": lambda t: Call("post", f"/api/v1/jobs/{t.job}/cancel"),
    "GET /api/v1/jobs/{id}/logs": lambda t: Call("get", f"/api/v1/jobs/{t.job}/logs", {"tail": 10}),
    "GET /api/v1/arrays/{id}": lambda t: Call("get", f"/api/v1/arrays/{t.array}"),
    "PATCH /api/v1/arrays/{id}": lambda t: Call("patch", f"/api/v1/arrays/{t.array}", {"max_running": 5}),
    "POST /api/v1/arrays/{id}/cancel": lambda t: Call("post", f"/api/v1/arrays/{t.array}/cancel"),
    "GET /api/v1/notebooks": lambda t: Call("get", "/api/v1/notebooks", {"team": t.team_slug}),
    "POST /api/v1/notebooks": lambda t: Call("post", "/api/v1/notebooks", {"name": "nb", "team": t.team_slug}),
    "GET /api/v1/notebooks/{id}": lambda t: Call("get", f"/api/v1/notebooks/{t.notebook}"),
    "POST /api/v1/notebooks/{id}/stop": lambda t: Call("post", f"/api/v1/notebooks/{t.notebook}/stop"),
    "GET /api/v1/notebooks/{id}/logs": lambda t: Call("get", f"/api/v1/notebooks/{t.notebook}/logs", {"offset": 0}),
    "GET /api/v1/dev-sessions": lambda t: Call("get", "/api/v1/dev-sessions", {"team": t.team_slug}),
    "POST /api/v1/dev-sessions": lambda t: Call("post", "/api/v1/dev-sessions", {"name": "dev", "team": t.team_slug}),
    "GET /api/v1/dev-sessions/{id}": lambda t: Call("get", f"/api/v1/dev-sessions/{t.dev_session}"),
    "POST /api/v1/dev-sessions/{id}/stop": lambda t: Call("post", f"/api/v1/dev-sessions/{t.dev_session}/stop"),
    "GET /api/v1/dev-sessions/{id}/logs": lambda t: Call("get", f"/api/v1/dev-sessions/{t.dev_session}/logs", {"tail": 5}),
    "DELETE /api/v1/ssh-keys/{id}": lambda t: Call("delete", f"/api/v1/ssh-keys/{t.ssh_key}"),
    "GET /api/v1/teams/{id}/quota": lambda t: Call("get", f"/api/v1/teams/{t.team}/quota"),
    "GET /api/v1/reports/usage": lambda t: Call("get", "/api/v1/reports/usage", {"unit": t.team}),
    "GET /api/v1/fairshare": lambda t: Call("get", "/api/v1/fairshare", {"team": t.team_slug}),
    "POST /api/v1/jobs/{id}/rerun": lambda t: Call("post", f"/api/v1/jobs/{t.job}/rerun"),
    "POST /api/v1/jobs/preview": lambda t: Call("post", "/api/v1/jobs/preview", _job_body(t)),
    "GET /api/v1/me/quota": lambda t: Call("get", "/api/v1/me/quota", {"team": t.team_slug}),
    "GET /api/v1/registry-credentials": lambda t: Call("get", "/api/v1/registry-credentials", {"unit": t.team_slug}),
    "POST /api/v1/registry-credentials": lambda t: Call(
        "post", "/api/v1/registry-credentials", {"unit": t.team_slug, "registry": "nvcr.io", "username": "u", "password": "p"}
    ),
    "DELETE /api/v1/registry-credentials/{id}": lambda t: Call("delete", f"/api/v1/registry-credentials/{t.credential}"),
    "GET /api/v1/services": lambda t: Call("get", "/api/v1/services", {"team": t.team_slug}),
    "POST /api/v1/services": lambda t: Call(
        "post", "/api/v1/services", {"name": "svc", "team": t.team_slug, "gpu_type": "H100", "command": "serve"}
    ),
    "GET /api/v1/services/{id}": lambda t: Call("get", f"/api/v1/services/{t.service}"),
    "PATCH /api/v1/services/{id}": lambda t: Call("patch", f"/api/v1/services/{t.service}", {"replicas": 2}),
    "DELETE /api/v1/services/{id}": lambda t: Call("delete", f"/api/v1/services/{t.service}"),
    "POST /api/v1/services/{id}/scale": lambda t: Call("post", f"/api/v1/services/{t.service}/scale", {"replicas": 2}),
    "POST /api/v1/services/{id}/rollout": lambda t: Call("post", f"/api/v1/services/{t.service}/rollout", {"command": "x"}),
    "GET /api/v1/services/{id}/logs": lambda t: Call("get", f"/api/v1/services/{t.service}/logs", {"tail": 5}),
    "GET /api/v1/services/{id}/tokens": lambda t: Call("get", f"/api/v1/services/{t.service}/tokens"),
    "POST /api/v1/services/{id}/tokens": lambda t: Call("post", f"/api/v1/services/{t.service}/tokens", {"name": "t"}),
    "DELETE /api/v1/services/{id}/tokens/{token_id}": lambda t: Call(
        "delete", f"/api/v1/services/{t.service}/tokens/{t.service_token}"
    ),
}
# Operations with no tenant object to aim at: they only ever answer about the caller (their own SSH keys:
# listing and adding one's own; tests/tenants/test_ssh_keys.py holds that no one else's is listed).
NO_TENANT_OBJECT = {"GET /api/v1/me", "GET /api/v1/ssh-keys", "POST /api/v1/ssh-keys"}


def _api_operations() -> set[str]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    methods = {"get", "post", "put", "patch", "delete"}
    return {
        f"{method.upper()} {path}"
        for path, item in schema["paths"].items()
        if path.startswith("/api/v1/")
        for method in item
        if method in methods
    }


def test_every_api_operation_is_in_the_matrix():
    assert _api_operations() == set(MATRIX) | NO_TENANT_OBJECT


def _fingerprint() -> tuple[Any, ...]:
    return (
        sorted(Job.objects.values_list("id", "state", "attempt", "stop_requested_at", "stop_reason", "name")),
        sorted(JobArray.objects.values_list("id", "task_count", "max_running")),
        JobEvent.objects.count(),
        Task.objects.count(),
        sorted(Task.objects.values_list("id", "state")),
        Allocation.objects.filter(released_at__isnull=True).count(),
        AuditEntry.objects.count(),
        OrgUnit.objects.count(),
        Quota.objects.count(),
        Membership.objects.count(),
        ApiToken.objects.filter(revoked_at__isnull=True).count(),
        TaskLogChunk.objects.count(),
        sorted(RegistryCredential.objects.values_list("id", "username", "password_sealed")),
        sorted(Service.objects.values_list("id", "state", "replicas", "revision")),
        sorted(ServiceToken.objects.values_list("id", "revoked_at")),
        sorted(SshKey.objects.values_list("id", "user_id", "fingerprint")),
    )


@pytest.fixture
def tenant_b(cast):
    node = make_cluster(nodes=1)[0]
    job = make_job(team=cast.org.team_c, user=cast.bea, state=JobState.RUNNING, started_at=timezone.now())
    task = Task.objects.create(job=job, attempt=1, rank=0, node=node)
    TaskLogChunk.objects.create(task=task, offset=0, data="secret of tenant B\n")
    notebook = make_job(team=cast.org.team_c, user=cast.bea, kind=JobKind.NOTEBOOK)
    credential = RegistryCredential.objects.create(unit=cast.org.team_c, registry="nvcr.io", username="b", password_sealed="x")
    service = Service.objects.create(name="svc-b", team=cast.org.team_c, user=cast.bea, gpu_type="H100")
    token = ServiceToken.objects.create(service=service, name="b", prefix="ysvc_x", token_hash="0" * 64)
    dev = make_job(team=cast.org.team_c, user=cast.bea, kind=JobKind.DEV, state=JobState.RUNNING, started_at=timezone.now())
    Task.objects.create(job=dev, attempt=1, rank=0, node=node, state="RUNNING", dev_endpoint="10.0.0.9:20001")
    key = ssh_key_add(user=cast.bea, name="bea", public_key=ED25519)
    spec = JobSpec(name="sweep", team=cast.org.team_c, command="true")
    array = job_array_submit(user=cast.bea, spec=spec, array="0-2%1").array
    return Target(
        job=job.pk,
        notebook=notebook.pk,
        team=cast.org.team_c.pk,
        team_slug=cast.org.team_c.slug,
        credential=credential.pk,
        service=service.pk,
        service_token=token.pk,
        dev_session=dev.pk,
        ssh_key=key.pk,
        array=array.pk,
    )


def test_tenant_a_gets_no_2xx_and_changes_nothing_on_tenant_b_or_unknown_objects(cast, tenant_b):
    unknown = Target(job=UNKNOWN, notebook=UNKNOWN, team=UNKNOWN, team_slug="no-such-team")
    clients = {
        "session": session_client(cast.ann),
        "personal token": token_client(cast.ann_token),
        "CI token": token_client(cast.ci_token),
    }
    before = _fingerprint()
    leaks = []
    for operation, build in sorted(MATRIX.items()):
        for target_name, target in (("tenant B", tenant_b), ("unknown", unknown)):
            call = build(target)
            for client_name, client in clients.items():
                kwargs: dict[str, Any] = {"format": "json"} if call.method in ("post", "patch") else {}
                response = getattr(client, call.method)(call.path, call.data, **kwargs)
                if 200 <= response.status_code < 300 or response.status_code >= 500:
                    leaks.append(f"{operation} on {target_name} with {client_name}: {response.status_code}")
    assert leaks == []
    assert _fingerprint() == before


def test_another_tenants_object_and_a_missing_one_get_the_same_answer(cast, tenant_b):
    client = token_client(cast.ann_token)
    theirs = client.get(f"/api/v1/jobs/{tenant_b.job}")
    missing = client.get(f"/api/v1/jobs/{UNKNOWN}")
    assert (theirs.status_code, theirs.json()) == (missing.status_code, missing.json()) == (404, missing.json())
