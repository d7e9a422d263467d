"""Writes to services: create, change (a new revision, rolled out), scale, roll back, delete; their tokens.

Keyword-only, atomic, audited. None of them makes or ends a replica itself: they change what is wanted
and kick the controller (controller.py), which alone makes and ends replica jobs, under the service's
row lock, so a person's change and the autoscaler never race each other into two replicas.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from scheduling.models import JobKind, RolloutState, Service, ServiceRevision, ServiceState, ServiceToken
from scheduling.models.serving import REVISION_SHAPE_FIELDS
from scheduling.services import JobSpec, service_replica_check
from scheduling.serving.kick import serving_request
from tenants.models import OrgUnit
from tenants.services import audit

NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
MAX_SERVICE_REPLICAS = 64
# What a person may change in place, without new replicas.
SCALING_FIELDS = ("replicas", "min_replicas", "max_replicas", "target_inflight", "scale_cooldown_s", "progress_deadline_s")
RELEASE_FIELDS = ("image", "command", "env", "container_mounts", "container_workdir")


@dataclass(frozen=True)
class ServiceSpec:
    """A service as a person asks for it (the API's and the form's fields)."""

    name: str
    team: OrgUnit
    gpu_type: str
    tier: int = 1
    replicas: int = 1
    min_replicas: int | None = None  # None: the same as replicas (no autoscaling)
    max_replicas: int | None = None
    target_inflight: float = 4.0
    scale_cooldown_s: int = 60
    nodes_per_replica: int = 1
    gpus_per_node: int = 1
    cpus_per_node: int | None = None
    memory_mb_per_node: int | None = None
    port: int | None = None
    readiness_path: str = "/"
    liveness_path: str = ""
    probe_period_s: float = 2.0
    probe_timeout_s: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1
    initial_delay_s: float = 0.0
    progress_deadline_s: int = 600
    image: str = ""
    command: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    container_mounts: Any = field(default_factory=list)
    container_workdir: str = ""


def replica_job_spec(*, service: Service, revision: ServiceRevision) -> JobSpec:
    """The job one replica of ``service`` at ``revision`` is: a gang of nodes_per_replica nodes, one per node."""
    shape = {**{name: getattr(service, name) for name in REVISION_SHAPE_FIELDS}, **(revision.shape or {})}
    return JobSpec(
        name=f"{service.name}-r{revision.number}",
        team=service.team,
        tier=int(shape["tier"]),
        kind=JobKind.SERVICE,
        replicas=int(shape["nodes_per_replica"]),
        gpus_per_replica=int(shape["gpus_per_node"]),
        gpu_type=str(shape["gpu_type"]),
        command=revision.command,
        env=dict(revision.env or {}),
        one_per_node=int(shape["nodes_per_replica"]) > 1,
        cpus_per_replica=int(shape["cpus_per_node"]),
        memory_mb_per_replica=int(shape["memory_mb_per_node"]),
        image=revision.image,
        container_mounts=list(revision.container_mounts or []),
        container_workdir=revision.container_workdir,
    )


def _check(spec: ServiceSpec, *, user: User, name_taken: bool) -> ServiceSpec:
    """Field errors a person can fix, all at once; the spec with min/max filled in."""
    errors: dict[str, list[str]] = defaultdict(list)
    if not NAME.match(spec.name or ""):
        errors["name"].append(
            "Lowercase letters, digits and dashes, 1-63, starting and ending with a letter or digit (it is part of a URL)"
        )
    elif name_taken:
        errors["name"].append(f"The team has a service called {spec.name} already: pick another name, or change that one")
    # Not given: the replicas asked for (no autoscaling), within whichever bound was given.
    if spec.min_replicas is not None:
        low = spec.min_replicas
    else:
        low = spec.replicas if spec.max_replicas is None else min(spec.replicas, spec.max_replicas)
    high = max(spec.replicas, low) if spec.max_replicas is None else spec.max_replicas
    if not 1 <= low <= high <= MAX_SERVICE_REPLICAS:
        errors["max_replicas"].append(f"1 <= min_replicas <= max_replicas <= {MAX_SERVICE_REPLICAS}")
    elif not low <= spec.replicas <= high:
        errors["replicas"].append(f"Between min_replicas ({low}) and max_replicas ({high})")
    if not 0.1 <= spec.target_inflight <= 10_000:
        errors["target_inflight"].append("Between 0.1 and 10000 requests in flight per replica")
    if not 0 <= spec.scale_cooldown_s <= 86_400:
        errors["scale_cooldown_s"].append("Between 0 and 86400 seconds")
    if not 1 <= spec.nodes_per_replica <= 64:
        errors["nodes_per_replica"].append("Between 1 and 64 nodes per replica")
    if spec.port is not None and not 1024 <= spec.port <= 65535:
        errors["port"].append("Between 1024 and 65535, or leave it blank to listen on $PORT")
    for name in ("readiness_path", "liveness_path"):
        path = getattr(spec, name)
        if (path or name == "readiness_path") and (
            not path.startswith("/") or len(path) > 512 or any(c in path for c in " \x00\r\n")
        ):
            errors[name].append("A path on the server, starting with /, e.g. /health")
    if not 0.2 <= spec.probe_period_s <= 300:
        errors["probe_period_s"].append("Between 0.2 and 300 seconds")
    if not 0.05 <= spec.probe_timeout_s <= 60:
        errors["probe_timeout_s"].append("Between 0.05 and 60 seconds")
    if not 1 <= spec.failure_threshold <= 100:
        errors["failure_threshold"].append("Between 1 and 100")
    if not 1 <= spec.success_threshold <= 100:
        errors["success_threshold"].append("Between 1 and 100")
    if not 0 <= spec.initial_delay_s <= 3600:
        errors["initial_delay_s"].append("Between 0 and 3600 seconds")
    if not 30 <= spec.progress_deadline_s <= 86_400:
        errors["progress_deadline_s"].append("Between 30 and 86400 seconds")
    if not spec.image and not spec.command.strip():
        errors["command"].append("A service runs a command (or an image's own entry point): e.g. python -m http.server $PORT")
    spec = replace(spec, min_replicas=low, max_replicas=high)
    # The replica as a job: its GPUs, team, image and environment, and whether it could ever run.
    job = JobSpec(
        name=spec.name or "service",
        team=spec.team,
        tier=spec.tier,
        kind=JobKind.SERVICE,
        replicas=spec.nodes_per_replica,
        gpus_per_replica=spec.gpus_per_node,
        gpu_type=spec.gpu_type,
        command=spec.command,
        env=spec.env,
        one_per_node=spec.nodes_per_replica > 1,
        cpus_per_replica=spec.cpus_per_node,
        memory_mb_per_replica=spec.memory_mb_per_node,
        image=spec.image,
        container_mounts=spec.container_mounts,
        container_workdir=spec.container_workdir,
    )
    try:
        service_replica_check(user=user, spec=job)
    except ValidationError as exc:
        for key, messages in exc.message_dict.items():
            key = {"replicas": "nodes_per_replica", "gpus_per_replica": "gpus_per_node", "cpus_per_replica": "cpus_per_node"}.get(
                key, "memory_mb_per_node" if key == "memory_mb_per_replica" else key
            )
            errors[key].extend(messages)
    if errors:
        raise ValidationError(dict(errors))
    return spec


def _shape_of(spec: ServiceSpec | Service) -> dict[str, Any]:
    return {name: getattr(spec, name) for name in REVISION_SHAPE_FIELDS}


def _release_of(spec: ServiceSpec) -> dict[str, Any]:
    return {
        "image": spec.image,
        "command": spec.command,
        "env": dict(spec.env),
        "container_mounts": list(spec.container_mounts or []),
        "container_workdir": spec.container_workdir,
    }


def _normalised(spec: ServiceSpec) -> ServiceSpec:
    """The image, mounts and resources as they are stored (the replica check has passed)."""
    from scheduling.services import resources_of, with_default_resources

    job = with_default_resources(
        JobSpec(
            name=spec.name,
            team=spec.team,
            gpus_per_replica=spec.gpus_per_node,
            gpu_type=spec.gpu_type,
            cpus_per_replica=spec.cpus_per_node,
            memory_mb_per_replica=spec.memory_mb_per_node,
        )
    )
    cpus, memory = resources_of(job)
    image = spec.image
    if image:
        from scheduling import images

        image = str(images.parse_image(image))
        mounts = images.parse_mounts(spec.container_mounts)
        workdir = images.check_workdir(spec.container_workdir)
        spec = replace(spec, container_mounts=mounts, container_workdir=workdir)
    return replace(spec, image=image, cpus_per_node=cpus, memory_mb_per_node=memory)


@transaction.atomic
def service_create(*, user: User, spec: ServiceSpec) -> Service:
    """Check and create the service at revision 1; the controller makes its replicas (they queue like jobs).
    Raises ValidationError naming each field to change."""
    taken = Service.objects.filter(team=spec.team, name=spec.name).exclude(state=ServiceState.DELETED).exists()
    spec = _normalised(_check(spec, user=user, name_taken=taken))
    try:
        with transaction.atomic():
            service = Service.objects.create(
                name=spec.name,
                team=spec.team,
                user=user,
                replicas=spec.replicas,
                min_replicas=spec.min_replicas or spec.replicas,
                max_replicas=spec.max_replicas or spec.replicas,
                target_inflight=spec.target_inflight,
                scale_cooldown_s=spec.scale_cooldown_s,
                progress_deadline_s=spec.progress_deadline_s,
                revision=1,
                rollout_state=RolloutState.PROGRESSING,
                rollout_started_at=timezone.now(),
                **_shape_of(spec),
            )
    except IntegrityError:
        raise ValidationError({"name": [f"The team has a service called {spec.name} already"]}) from None
    ServiceRevision.objects.create(service=service, number=1, shape=_shape_of(spec), created_by=user, **_release_of(spec))
    audit(
        actor=user,
        action="service.create",
        obj=service,
        unit=service.team,
        message=f"{service}: {service.replicas} x {service.nodes_per_replica}x{service.gpus_per_node} {service.gpu_type}, "
        f"tier {service.tier}",
    )
    serving_request(service_ids=[service.pk])
    return service


def spec_of(service: Service, revision: ServiceRevision | None = None) -> ServiceSpec:
    """The service as a spec: its current shape and scaling, and ``revision``'s release (default: the current one)."""
    revision = revision or service.revisions.get(number=service.revision)
    return ServiceSpec(
        name=service.name,
        team=service.team,
        **{name: getattr(service, name) for name in (*SCALING_FIELDS, *REVISION_SHAPE_FIELDS)},
        image=revision.image,
        command=revision.command,
        env=dict(revision.env or {}),
        container_mounts=list(revision.container_mounts or []),
        container_workdir=revision.container_workdir,
    )


@transaction.atomic
def service_update(*, user: User, service: Service, changes: Mapping[str, Any]) -> Service:
    """Change a service. Scaling fields apply at once; a change to its image, command, environment, shape
    or probes is a new revision, rolled out replica by replica (docs/services.md). Raises ValidationError."""
    service = Service.objects.select_for_update().select_related("team").get(pk=service.pk)
    _refuse_if_deleted(service)
    unknown = set(changes) - {f.name for f in fields(ServiceSpec)} - {"name", "team"}
    if unknown or changes.get("name", service.name) != service.name or changes.get("team", service.team) != service.team:
        raise ValidationError({NON_FIELD_ERRORS: ["A service's name and team cannot change: create another service"]})
    current = spec_of(service)
    wanted = replace(current, **{k: v for k, v in changes.items() if k not in ("name", "team")})
    if "replicas" in changes and "min_replicas" not in changes and not service.autoscaled:
        wanted = replace(wanted, min_replicas=wanted.replicas, max_replicas=wanted.replicas)
    wanted = _normalised(_check(wanted, user=user, name_taken=False))
    for name in SCALING_FIELDS:
        setattr(service, name, getattr(wanted, name))
    rolled = _release_of(wanted) != _release_of(current) or _shape_of(wanted) != _shape_of(current)
    if rolled:
        _new_revision(service=service, user=user, spec=wanted, why="changed")
    service.save()
    audit(
        actor=user,
        action="service.update",
        obj=service,
        unit=service.team,
        message=f"{service}: " + (f"revision {service.revision}, rolling out" if rolled else "scaling changed"),
        data={"changed": sorted(changes)},
    )
    serving_request(service_ids=[service.pk])
    return service


def _new_revision(*, service: Service, user: User | None, spec: ServiceSpec, why: str) -> ServiceRevision:
    revision = ServiceRevision.objects.create(
        service=service, number=service.revision + 1, shape=_shape_of(spec), created_by=user, **_release_of(spec)
    )
    for name, value in _shape_of(spec).items():
        setattr(service, name, value)
    service.rollout_from = service.revision
    service.revision = revision.number
    service.rollout_state = RolloutState.PROGRESSING
    service.rollout_started_at = timezone.now()
    service.rollout_message = f"revision {revision.number} ({why}) replaces revision {service.rollout_from}"
    return revision


@transaction.atomic
def service_scale(*, user: User, service: Service, replicas: int) -> Service:
    """Set how many replicas there should be; an autoscaled service takes it within its min and max."""
    return service_update(user=user, service=service, changes={"replicas": replicas})


@transaction.atomic
def service_rollback(*, user: User | None, service: Service, to_revision: int | None = None, why: str = "") -> Service:
    """Roll out an earlier revision again (as a new revision, as `kubectl rollout undo` does); by default the
    one before the current. Raises ValidationError if there is none."""
    service = Service.objects.select_for_update().select_related("team").get(pk=service.pk)
    _refuse_if_deleted(service)
    target = to_revision or service.rollout_from or service.revision - 1
    old = service.revisions.filter(number=target).first()
    if old is None or target == service.revision:
        raise ValidationError({"revision": [f"No earlier revision {target} to roll back to (revisions 1-{service.revision})"]})
    spec = spec_of(service, old)
    spec = replace(spec, **{name: value for name, value in (old.shape or {}).items() if name in REVISION_SHAPE_FIELDS})
    _new_revision(service=service, user=user, spec=spec, why=why or f"back to revision {target}")
    service.save()
    audit(
        actor=user,
        actor_label=None if user else "service controller",
        action="service.rollback",
        obj=service,
        unit=service.team,
        message=f"{service}: revision {service.revision} rolls back to revision {target}'s release"
        + (f" ({why})" if why else ""),
    )
    serving_request(service_ids=[service.pk])
    return service


@transaction.atomic
def service_delete(*, user: User, service: Service) -> Service:
    """Drain and stop every replica; the service is gone (its name free again) once none is left."""
    service = Service.objects.select_for_update().get(pk=service.pk)
    if service.state != ServiceState.ACTIVE:
        return service
    Service.objects.filter(pk=service.pk).update(state=ServiceState.DELETING)
    service.state = ServiceState.DELETING
    ServiceToken.objects.filter(service=service, revoked_at__isnull=True).update(revoked_at=timezone.now())
    audit(actor=user, action="service.delete", obj=service, unit=service.team, message=f"{service}: deleting its replicas")
    serving_request(service_ids=[service.pk])
    return service


def _refuse_if_deleted(service: Service) -> None:
    if service.state != ServiceState.ACTIVE:
        raise ValidationError({NON_FIELD_ERRORS: [f"Service {service.name} is being deleted"]})


# --------------------------------------------------------------------------- tokens

TOKEN_PREFIX = "ysvc_"


def token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


@transaction.atomic
def service_token_create(*, user: User, service: Service, name: str) -> tuple[ServiceToken, str]:
    """A new token for the service's endpoint: (the row, the token). The token is shown once; only its hash is kept."""
    _refuse_if_deleted(service)
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise ValidationError({"name": ["Name the token (1-100 characters), e.g. the caller that uses it"]})
    raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = ServiceToken.objects.create(service=service, name=name, prefix=raw[:12], token_hash=token_hash(raw), created_by=user)
    audit(actor=user, action="service.token.create", obj=service, unit=service.team, message=f"{service}: token {token}")
    return token, raw


@transaction.atomic
def service_token_revoke(*, user: User, token: ServiceToken) -> ServiceToken:
    if ServiceToken.objects.filter(pk=token.pk, revoked_at__isnull=True).update(revoked_at=timezone.now()):
        token.refresh_from_db()
        audit(actor=user, action="service.token.revoke", obj=token.service, unit=token.service.team, message=f"token {token}")
    return token
