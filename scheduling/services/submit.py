"""Submitting a job: its spec, the checks a submission must pass (with the reasons that say what to
change), the admission verdict and preview, idempotent creation."""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from scheduling import images
from scheduling.core.capacity import Capacity, refusal
from scheduling.core.eta import admit as eta_admit
from scheduling.core.types import LeafLocality, PendingJob, QuotaUnit, Verdict
from scheduling.core.types import Tier as CoreTier
from scheduling.models import LEAF_LOCALITY_CHOICES, Job, JobEvent, JobKind
from scheduling.selectors import cluster_capacity, quota_chain, snapshot_build, yard_number
from scheduling.selectors.snapshot import NO_TIME_LIMIT_S
from scheduling.services.common import (
    _ENV_NAME,
    MAX_GPUS_PER_REPLICA,
    MAX_REPLICAS,
    MAX_TIME_LIMIT_S,
    IdempotencyConflict,
    cycle_request,
)  # fmt: skip
from scheduling.services.job_insert import insert_sql, job_values
from scheduling.states import JobState
from tenants.compiled import CompiledQuery
from tenants.models import AuditEntry, OrgUnit
from tenants.services import audit


@dataclass(frozen=True)
class JobSpec:
    name: str
    team: OrgUnit
    tier: int = 2
    kind: str = "batch"
    replicas: int = 1
    gpus_per_replica: int = 1
    gpu_type: str = "H100"
    command: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    time_limit_s: int | None = None
    checkpoint_dir: str = ""
    priority: int = 0
    leaf_locality: str = "auto"
    one_fabric: bool = False  # all its nodes in one multi-node NVLink domain, or wait (Slurm's --segment)
    one_per_node: bool = False  # each replica on a node of its own (Slurm's --nodes=N: N distinct nodes)
    # None: the deployment's default per GPU of a replica (``with_default_resources``).
    cpus_per_replica: int | None = None
    memory_mb_per_replica: int | None = None
    # A container image to run in (docs/containers.md), its mounts ({source, target, readonly} or pyxis's
    # SRC:DST[:ro|rw],...) and working directory; "": on the host, as before.
    image: str = ""
    container_mounts: Any = field(default_factory=list)
    container_workdir: str = ""


def with_default_resources(spec: JobSpec) -> JobSpec:
    """The spec with its cores and memory per replica filled in where it left them out: the deployment's
    YARD_DEFAULT_CPUS_PER_GPU and YARD_DEFAULT_MEMORY_MB_PER_GPU times the replica's GPUs."""
    if spec.cpus_per_replica is not None and spec.memory_mb_per_replica is not None:
        return spec
    cpus, memory_mb = resources_of(spec)
    return replace(spec, cpus_per_replica=cpus, memory_mb_per_replica=memory_mb)


def resources_of(spec: JobSpec) -> tuple[int, int]:
    """The spec's cores and MiB per replica, the defaults where it left them out."""
    gpus = max(spec.gpus_per_replica, 1) if isinstance(spec.gpus_per_replica, int) else 1
    cpus = spec.cpus_per_replica
    memory_mb = spec.memory_mb_per_replica
    return (
        cpus if cpus is not None else int(yard_number("DEFAULT_CPUS_PER_GPU")) * gpus,
        memory_mb if memory_mb is not None else int(yard_number("DEFAULT_MEMORY_MB_PER_GPU")) * gpus,
    )


def job_spec_of(job: Job, **changes: Any) -> JobSpec:
    """A job's own spec, to submit again ("Run again", ``POST /jobs/{id}/rerun``), with ``changes``. The copy
    gets its own checkpoint directory."""
    fields: dict[str, Any] = {
        "name": job.name,
        "team": job.team,
        "tier": job.tier,
        "kind": job.kind,
        "replicas": job.replicas,
        "gpus_per_replica": job.gpus_per_replica,
        "gpu_type": job.gpu_type,
        "command": job.command,
        "env": dict(job.env or {}),
        "time_limit_s": job.time_limit_s,
        "priority": job.priority,
        "leaf_locality": job.leaf_locality,
        "one_fabric": job.one_fabric,
        "one_per_node": job.one_per_node,
        "cpus_per_replica": job.cpus_per_replica,
        "memory_mb_per_replica": job.memory_mb_per_replica,
        "image": job.image,
        "container_mounts": list(job.container_mounts or []),
        "container_workdir": job.container_workdir,
    }
    fields.update(changes)
    return JobSpec(**fields)


# --------------------------------------------------------------------------- submit


def _default_time_limit() -> int:
    return int(yard_number("DEFAULT_TIME_LIMIT_S"))


def _team_dir(team: OrgUnit) -> PurePosixPath:
    return PurePosixPath(str(settings.YARD["CHECKPOINT_ROOT"])) / team.slug


NEVER_RUNS = "This job can never run"
# The kinds a person launches as one replica on one node, and what they are called in messages.
ONE_REPLICA_KINDS: dict[str, str] = {JobKind.NOTEBOOK: "notebook", JobKind.DEV: "dev session"}


def _validate_spec(*, user: User, spec: JobSpec, capacity: Capacity | None = None, service_made: bool = False) -> None:
    """Field errors a person can fix, keyed by field, all at once."""
    from tenants.selectors import may_submit_to

    errors: dict[str, list[str]] = defaultdict(list)
    if not spec.name.strip():
        errors["name"].append("Give the job a name")
    elif len(spec.name) > 200:
        errors["name"].append("At most 200 characters")
    if not may_submit_to(user=user, team=spec.team):
        errors["team"].append("You cannot submit jobs for this team")
    if spec.tier not in (1, 2, 3):
        errors["tier"].append("Tier is 1 (production), 2 (research) or 3 (spot)")
    if spec.kind not in JobKind.values:
        errors["kind"].append(f"Kind is one of {', '.join(JobKind.values)}")
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        errors["replicas"].append(f"Between 1 and {MAX_REPLICAS}")
    if spec.kind in ONE_REPLICA_KINDS and spec.replicas != 1:
        errors["replicas"].append(f"A {ONE_REPLICA_KINDS[spec.kind]} runs as one replica")
    if spec.kind == JobKind.DEV and spec.command.strip():
        # Its agent runs the session's sshd (docs/dev-sessions.md): a command would never run.
        errors["command"].append("A dev session runs no command: its node runs an SSH server you log in to")
    if spec.kind == JobKind.SERVICE and not service_made:
        errors["kind"].append("A service's replicas are made by its service: create a service (POST /api/v1/services/)")
    if not 1 <= spec.gpus_per_replica <= MAX_GPUS_PER_REPLICA:
        errors["gpus_per_replica"].append(f"Between 1 and {MAX_GPUS_PER_REPLICA}")
    if not spec.gpu_type or len(spec.gpu_type) > 32:
        errors["gpu_type"].append("Name a GPU type, e.g. H100")
    elif spec.gpu_type not in (known := (capacity or cluster_capacity()).types):
        # On the field it is about (the admission check would say it as a non-field error); the prefix is
        # what the API's never_runnable answer and `yard submit` (exit 121) recognise.
        errors["gpu_type"].append(
            f"{NEVER_RUNS}: the cluster has no {spec.gpu_type} GPUs (it has: {', '.join(known) or 'none yet'})"
        )
    if spec.time_limit_s is not None and not 60 <= spec.time_limit_s <= MAX_TIME_LIMIT_S:
        errors["time_limit_s"].append(f"Between 60 and {MAX_TIME_LIMIT_S} seconds")
    if not -1000 <= spec.priority <= 1000:
        errors["priority"].append("Between -1000 and 1000")
    if spec.leaf_locality not in {value for value, _ in LEAF_LOCALITY_CHOICES}:
        errors["leaf_locality"].append("One of auto, required, preferred")
    if spec.cpus_per_replica is not None and not 1 <= spec.cpus_per_replica <= 1024:
        errors["cpus_per_replica"].append("Between 1 and 1024 CPU cores per replica")
    if spec.memory_mb_per_replica is not None and not 1 <= spec.memory_mb_per_replica <= 16 * 1024 * 1024:
        errors["memory_mb_per_replica"].append("Between 1 MiB and 16 TiB per replica")
    if len(spec.command) > 100_000:
        errors["command"].append("At most 100000 characters")
    elif spec.kind == JobKind.BATCH and not spec.command.strip():
        # A batch job without one would start nothing on every rank and end COMPLETED, exit 0.
        errors["command"].append("A batch job needs a command: what each replica runs, e.g. torchrun --nproc-per-node 8 train.py")
    if not isinstance(spec.env, Mapping) or len(spec.env) > 200:
        errors["env"].append("A mapping of at most 200 variables")
    else:
        for key, value in spec.env.items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                errors["env"].append(f"{str(key)[:40]!r} is not a valid variable name")
            elif not isinstance(value, str) or len(value) > 10_000 or "\x00" in value:
                errors["env"].append(f"{key}: the value must be text of at most 10000 characters")
    if spec.checkpoint_dir:
        team_dir = _team_dir(spec.team)
        wanted = PurePosixPath(posixpath.normpath(spec.checkpoint_dir))
        if (
            "\x00" in spec.checkpoint_dir
            or len(spec.checkpoint_dir) > 1024
            or not wanted.is_relative_to(team_dir)
            or wanted == team_dir
        ):
            errors["checkpoint_dir"].append(f"Must be inside your team's directory {team_dir}/")
    for text_field in ("name", "command", "gpu_type"):
        if "\x00" in getattr(spec, text_field):
            errors[text_field].append("Must not contain NUL characters")
    _validate_container(spec, errors)
    if errors:
        raise ValidationError({k: v for k, v in errors.items()})


def registry_allow() -> tuple[str, ...]:
    """The deployment's YARD_REGISTRY_ALLOW (empty: any registry), read per call so a test's settings apply."""
    return tuple(str(host) for host in cast(Iterable[Any], settings.YARD.get("REGISTRY_ALLOW", ())))


def _validate_container(spec: JobSpec, errors: dict[str, list[str]]) -> None:
    """The image against the deployment's allow-list (YARD_REGISTRY_ALLOW), its mounts and working directory."""
    if spec.image:
        try:
            images.check_image(spec.image, allow=registry_allow())
        except images.ImageError as exc:
            errors["image"].append(str(exc))
    elif spec.container_mounts or spec.container_workdir:
        errors["image"].append("Container mounts and a working directory need an image to run in: name one, or leave them out")
    try:
        images.parse_mounts(spec.container_mounts)
    except images.ImageError as exc:
        errors["container_mounts"].append(str(exc))
    try:
        images.check_workdir(spec.container_workdir)
    except images.ImageError as exc:
        errors["container_workdir"].append(str(exc))


def _container_fields(spec: JobSpec) -> dict[str, Any]:
    """The job's image, mounts and working directory as stored (normalised); the spec was validated."""
    if not spec.image:
        return {"image": "", "container_mounts": [], "container_workdir": ""}
    return {
        "image": str(images.parse_image(spec.image)),
        "container_mounts": images.parse_mounts(spec.container_mounts),
        "container_workdir": images.check_workdir(spec.container_workdir),
    }


def _pending_job_for(spec: JobSpec, *, job_id: str, now: datetime) -> PendingJob:
    return PendingJob(
        job_id=job_id,
        team=spec.team.slug,
        tier=CoreTier(spec.tier),
        replicas=spec.replicas,
        gpus_per_replica=spec.gpus_per_replica,
        gpu_type=spec.gpu_type,
        submit_time=now.timestamp(),
        time_limit=NO_TIME_LIMIT_S if spec.kind == JobKind.SERVICE else float(spec.time_limit_s or _default_time_limit()),
        priority=spec.priority,
        locality=LeafLocality(spec.leaf_locality),
        cpus_per_replica=spec.cpus_per_replica or 0,
        memory_mb_per_replica=spec.memory_mb_per_replica or 0,
        one_fabric=spec.one_fabric,
        one_per_node=spec.one_per_node,
    )


def _admission(spec: JobSpec, *, now: datetime) -> Verdict:
    """The full check, for a preview a person reads: can it ever run, and where or when it would start."""
    return eta_admit(snapshot_build(now=now), _pending_job_for(spec, job_id="new", now=now), now=now.timestamp())


QUEUED = "queued: the scheduler places it at its next cycle, in a second or two"


def _admission_fast(spec: JobSpec, *, now: datetime, capacity: Capacity | None = None) -> Verdict:
    """The same accept-or-refuse verdict as _admission, without a snapshot or a plan per submission
    (scheduling/core/capacity.py; tests/property/test_capacity.py holds them equal): a CI pipeline
    submitting hundreds of jobs a second must not rebuild the cluster for each. Where and when an
    accepted job starts is the next cycle's word, written into its pending reason a moment later."""
    job = _pending_job_for(spec, job_id="new", now=now)
    why = _refusal(capacity or cluster_capacity(), quota_chain(team=spec.team, gpu_type=spec.gpu_type), job)
    return Verdict(ok=False, reason=why) if why is not None else Verdict(ok=True, reason=QUEUED)


# refusal()'s answers for the cluster shape they were given: a CI burst posts one job shape to one team
# hundreds of times, and refusal walks every node of the type for each (a quarter of a millisecond at
# 500 nodes). Keyed by the quota chain as read for this submission and the whole job bar its id and
# time (neither says whether it can ever run); a new Capacity (the cluster changed) starts afresh.
_refusals: tuple[Capacity | None, dict[tuple[str, PendingJob], str | None]] = (None, {})


def _refusal(capacity: Capacity, chain: tuple[QuotaUnit, ...], job: PendingJob) -> str | None:
    global _refusals
    shape, known = _refusals
    if shape is not capacity or len(known) > 1000:
        known = {}
        _refusals = (capacity, known)
    key = (repr(chain), replace(job, job_id="", submit_time=0.0))
    if key not in known:
        known[key] = refusal(capacity, chain, job)
    return known[key]


def job_preview(*, user: User, spec: JobSpec) -> Verdict:
    """Would this job be accepted, and where or when would it start? Raises ValidationError for bad fields."""
    spec = with_default_resources(spec)
    _validate_spec(user=user, spec=spec)
    return _admission(spec, now=timezone.now())


def service_replica_check(*, user: User, spec: JobSpec) -> Verdict:
    """Would a service's replica of this shape be accepted (fields, then the admission check)? Raises
    ValidationError as job_submit does: a service is refused at creation, not when its first replica is made."""
    spec = with_default_resources(spec)
    capacity = cluster_capacity()
    _validate_spec(user=user, spec=spec, capacity=capacity, service_made=True)
    verdict = _admission_fast(spec, now=timezone.now(), capacity=capacity)
    if not verdict.ok:
        raise ValidationError({NON_FIELD_ERRORS: [f"{NEVER_RUNS}: {verdict.reason}"]})
    return verdict


def job_admit(*, user: User, spec: JobSpec, service_made: bool = False) -> tuple[JobSpec, Verdict, datetime]:
    """The checks a submission passes once, whether it makes one job or a whole array of them (the fields,
    the team's permission, the fast admission verdict): (the spec with its defaults, the verdict, now).
    Raises ValidationError as job_submit does."""
    spec = with_default_resources(spec)
    capacity = cluster_capacity()  # read once for the fields' check and the admission check
    _validate_spec(user=user, spec=spec, capacity=capacity, service_made=service_made)
    now = timezone.now()
    verdict = _admission_fast(spec, now=now, capacity=capacity)
    if not verdict.ok:
        raise ValidationError({NON_FIELD_ERRORS: [f"{NEVER_RUNS}: {verdict.reason}"]})
    return spec, verdict, now


def _same_spec(job: Job, spec: JobSpec) -> bool:
    return (
        job.name == spec.name
        and job.team_id == spec.team.pk
        and job.tier == spec.tier
        and job.kind == spec.kind
        and job.replicas == spec.replicas
        and job.gpus_per_replica == spec.gpus_per_replica
        and job.gpu_type == spec.gpu_type
        and job.command == spec.command
        and job.env == dict(spec.env)
        and job.time_limit_s == (spec.time_limit_s or _default_time_limit())
        and (not spec.checkpoint_dir or job.checkpoint_dir == posixpath.normpath(spec.checkpoint_dir))
        and job.priority == spec.priority
        and job.leaf_locality == spec.leaf_locality
        and job.one_fabric == spec.one_fabric
        and job.one_per_node == spec.one_per_node
        and job.cpus_per_replica == spec.cpus_per_replica
        and job.memory_mb_per_replica == spec.memory_mb_per_replica
        and _same_container(job, spec)
        and job.array_id is None  # a key used for an array is answered by the array's own check (arrays.py)
    )


def _same_container(job: Job, spec: JobSpec) -> bool:
    try:
        wanted = _container_fields(spec)
    except images.ImageError:
        return False
    return (job.image, job.container_mounts, job.container_workdir) == tuple(wanted.values())


# The key's job id, if any (at most one: a unique constraint), compiled once per thread (tenants/compiled.py).
_KEY_PROBE: CompiledQuery[Job] = CompiledQuery(
    lambda user_id, key: Job.objects.filter(user_id=user_id, idempotency_key=key).order_by().values_list("pk")[:1],
    -7_340_033,
    "\x00idempotency-key-sentinel",
)


def _existing_for_key(user: User, key: str, spec: JobSpec) -> Job | None:
    # Almost every key is new: ask for the id alone, and read the job only for a replay.
    found = _KEY_PROBE.rows(user.pk, key)
    if not found:
        return None
    pk = found[0][0]
    job = Job.objects.get(pk=pk)
    if not _same_spec(job, spec):
        raise IdempotencyConflict(job)
    return job


def job_submit(
    *,
    user: User,
    spec: JobSpec,
    idempotency_key: str | None = None,
    copied_from: Job | None = None,
    service_revision: tuple[int, int] | None = None,
) -> Job:
    """Validate, run the admission check, create the PENDING job; the same key and spec twice -> the same job.

    ``service_revision``: (service id, revision) when the service controller makes a replica (kind
    "service", docs/services.md): it gets no time limit.

    Raises ValidationError (field -> messages; "__all__" when the admission check refuses) and
    IdempotencyConflict when the key was used for another spec.
    """
    if idempotency_key is not None and (not idempotency_key or len(idempotency_key) > 128):
        raise ValidationError({"idempotency_key": "Between 1 and 128 characters"})
    spec = with_default_resources(spec)
    if idempotency_key and (existing := _existing_for_key(user, idempotency_key, spec)) is not None:
        return existing
    spec, verdict, now = job_admit(user=user, spec=spec, service_made=service_revision is not None)
    if connection.vendor == "postgresql":
        made = _insert_job(
            user=user, spec=spec, key=idempotency_key, copied_from=copied_from, now=now, verdict=verdict,
            service_revision=service_revision,
        )  # fmt: skip
        if made is None:
            # The key's job was committed meanwhile (ON CONFLICT DO NOTHING waited for it): answer with it.
            if idempotency_key and (existing := _existing_for_key(user, idempotency_key, spec)) is not None:
                return existing
            raise IntegrityError("the job was not inserted, and no job holds its Idempotency-Key")
        cycle_request()
        return made
    try:
        with transaction.atomic():
            job = _create_job(
                user=user,
                spec=spec,
                key=idempotency_key,
                copied_from=copied_from,
                now=now,
                verdict=verdict,
                service_revision=service_revision,
            )
    except IntegrityError:
        # A concurrent retry with the same key won the race: answer with its job.
        if idempotency_key and (existing := _existing_for_key(user, idempotency_key, spec)) is not None:
            return existing
        raise
    cycle_request()
    return job


def job_row(*, user: User, spec: JobSpec, now: datetime, pending_reason: str, **fields: Any) -> Job:
    """A new PENDING job of ``spec`` as it is stored, not yet saved (``fields``: the rest, e.g. its key): one
    place for the columns a submission fills, whether job_submit saves one or an array inserts thousands."""
    columns: dict[str, Any] = dict(
        name=spec.name,
        team=spec.team,
        user=user,
        tier=spec.tier,
        kind=spec.kind,
        replicas=spec.replicas,
        gpus_per_replica=spec.gpus_per_replica,
        gpu_type=spec.gpu_type,
        cpus_per_replica=resources_of(spec)[0],
        memory_mb_per_replica=resources_of(spec)[1],
        command=spec.command,
        env=dict(spec.env),
        time_limit_s=spec.time_limit_s or _default_time_limit(),
        priority=spec.priority,
        leaf_locality=spec.leaf_locality,
        one_fabric=spec.one_fabric,
        one_per_node=spec.one_per_node,
        **_container_fields(spec),
        submitted_at=now,
        state_changed_at=now,
        pending_reason=pending_reason,
    )
    return Job(**(columns | fields))


def _new_job(
    *,
    user: User,
    spec: JobSpec,
    key: str | None,
    copied_from: Job | None,
    now: datetime,
    verdict: Verdict,
    service_revision: tuple[int, int] | None = None,
) -> Job:
    """The job _create_job and _insert_job write, not yet saved (no id, no checkpoint directory)."""
    service_id, revision = service_revision or (None, None)
    return job_row(
        user=user,
        spec=spec,
        now=now,
        pending_reason=verdict.reason,
        # A service's replica runs until the service ends it: no time limit (0).
        time_limit_s=0 if service_id is not None else spec.time_limit_s or _default_time_limit(),
        service_id=service_id,
        service_revision=revision,
        idempotency_key=key,
        copied_from=copied_from,
    )


def _audit_of(job: Job, *, copied_from: Job | None, key: str | None) -> tuple[str, dict[str, Any]]:
    """The submit audit entry's message and data."""
    return (
        f"{job.name}: {job.replicas}x{job.gpus_per_replica} {job.gpu_type}, tier {job.tier}",
        {"copied_from": copied_from.pk if copied_from else None, "idempotency_key": key},
    )


def _insert_job(
    *,
    user: User,
    spec: JobSpec,
    key: str | None,
    copied_from: Job | None,
    now: datetime,
    verdict: Verdict,
    service_revision: tuple[int, int] | None = None,
) -> Job | None:
    """_create_job's rows in one statement (PostgreSQL): the job with its id from the sequence and its
    checkpoint directory named by it, its submit event and its audit entry; None when a job with its
    Idempotency-Key exists. The ORM wrote them in six (a savepoint, the INSERT, an UPDATE for the
    directory, two INSERTs, the release), a third of a submission's CPU in compiling them;
    tests/api/test_submission_fast_path.py holds the rows equal to _create_job's."""
    job = _new_job(
        user=user, spec=spec, key=key, copied_from=copied_from, now=now, verdict=verdict, service_revision=service_revision
    )
    message, data = _audit_of(job, copied_from=copied_from, key=key)
    reason = f"submitted; {verdict.reason}"
    label = user.get_username()
    data_field = AuditEntry._meta.get_field("data")
    values = job_values(job)
    params: list[Any] = [Job._meta.db_table]
    params += [v for v in values if v is not None]  # the NULLs are literals (scheduling/services/job_insert.py)
    params += [posixpath.normpath(spec.checkpoint_dir) if spec.checkpoint_dir else None, str(_team_dir(spec.team))]
    params += [now, JobState.PENDING, reason, user.pk, label]
    params += [timezone.now(), user.pk, label, spec.team.pk, message, data_field.get_db_prep_save(data, connection)]
    with connection.cursor() as cursor:
        cursor.execute(insert_sql(tuple(v is None for v in values)), params)
        row = cursor.fetchone()
    if row is None:
        return None
    job.pk, job.checkpoint_dir, event_id = row
    job._state.adding = False
    job._state.db = connection.alias
    event = JobEvent(
        pk=event_id, job=job, time=now, attempt=1, from_state="", to_state=JobState.PENDING, reason=reason, actor=user,
        actor_label=label,
    )  # fmt: skip
    event._state.adding = False
    event._state.db = connection.alias
    job.submit_event = event  # type: ignore[attr-defined]
    return job


def _create_job(
    *,
    user: User,
    spec: JobSpec,
    key: str | None,
    copied_from: Job | None,
    now: datetime,
    verdict: Verdict,
    service_revision: tuple[int, int] | None = None,
) -> Job:
    job = _new_job(
        user=user, spec=spec, key=key, copied_from=copied_from, now=now, verdict=verdict, service_revision=service_revision
    )
    job.save(force_insert=True)
    job.checkpoint_dir = (
        posixpath.normpath(spec.checkpoint_dir) if spec.checkpoint_dir else str(_team_dir(spec.team) / str(job.pk))
    )
    Job.objects.filter(pk=job.pk).update(checkpoint_dir=job.checkpoint_dir)
    event = JobEvent.objects.create(
        job=job,
        time=now,
        attempt=1,
        to_state=JobState.PENDING,
        reason=f"submitted; {verdict.reason}",
        actor=user,
        actor_label=user.get_username(),
    )
    # A new job's one event, for a caller that shows the job without reading it back.
    job.submit_event = event  # type: ignore[attr-defined]
    message, data = _audit_of(job, copied_from=copied_from, key=key)
    audit(actor=user, action="job.submit", obj=job, unit=spec.team, message=message, data=data)
    return job
