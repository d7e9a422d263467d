"""What a job submission's body becomes: the API's JSON or a job file (scheduling/jobfiles/), a JobSpec, a job.

Apart from the views because POST /jobs and POST /jobs/preview share all of it: the job-file parsers
and their translation into the API's fields (the translators' refusal as a 400 naming each place in
the file), the spec built from validated fields, "can never run" told apart from a bad field, and the
Idempotency-Key lock that tells a replay from a first submission.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from rest_framework import exceptions, status
from rest_framework.parsers import BaseParser
from rest_framework.request import Request

from scheduling import jobfiles
from scheduling.api import serializers as s
from scheduling.models import Job, JobKind, Node
from scheduling.services import NEVER_RUNS, ArraySubmitted, JobSpec, job_array_submit, job_submit
from tenants.models import Quota, UnitKind
from tenants.selectors import team_submittable, teams_submittable


def _spec_from(data: dict[str, Any], *, user: Any, kind: str) -> JobSpec:
    team = team_submittable(user=user, ref=data["team"])
    if team is None:
        # the same answer for a team that exists elsewhere as for none: no probing of the org tree
        raise ValidationError({"team": ["No such team, or not one you may submit to"]})
    if kind == JobKind.NOTEBOOK:
        return JobSpec(
            name=data["name"],
            team=team,
            tier=data["tier"],
            kind=JobKind.NOTEBOOK,
            replicas=1,
            gpus_per_replica=data["gpus"],
            gpu_type=data["gpu_type"],
            time_limit_s=data.get("time_limit_s"),
            image=data.get("image", ""),  # its Jupyter runs in the image (docs/containers.md)
        )
    if kind == JobKind.DEV:
        return JobSpec(
            name=data["name"].strip() or f"dev-{user.get_username()}",
            team=team,
            tier=data["tier"],
            kind=JobKind.DEV,
            replicas=1,
            gpus_per_replica=data["gpus"],
            gpu_type=data["gpu_type"],
            time_limit_s=data.get("time_limit_s"),
            cpus_per_replica=data.get("cpus"),
            memory_mb_per_replica=data.get("memory_mb"),
            image=data.get("image", ""),  # refused for now (scheduling/services/submit.py), said on its field
        )
    return JobSpec(
        name=data["name"],
        team=team,
        tier=data["tier"],
        replicas=data["replicas"],
        gpus_per_replica=data["gpus_per_replica"],
        gpu_type=data["gpu_type"],
        command=data["command"],
        env=data["env"],
        time_limit_s=data.get("time_limit_s"),
        checkpoint_dir=data["checkpoint_dir"],
        priority=data["priority"],
        leaf_locality=data["leaf_locality"],
        one_fabric=data["one_fabric"],
        one_per_node=data["one_per_node"],
        cpus_per_replica=data.get("cpus_per_replica"),
        memory_mb_per_replica=data.get("memory_mb_per_replica"),
        image=data.get("image", ""),
        container_mounts=data.get("container_mounts", []),
        container_workdir=data.get("container_workdir", ""),
    )


@dataclass(frozen=True)
class JobFileBody:
    """A request body that is a job file's text: YAML (ours or a Kubeflow manifest) or a Slurm script."""

    text: str
    script: bool


class TooLarge(exceptions.APIException):
    """A body over what the API accepts: 413, as portal/middleware.py answers for Django's own limit."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"


class _TextParser(BaseParser):
    script = False

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:  # a JobFileBody
        raw = stream.read(jobfiles.MAX_FILE_BYTES + 1) if stream is not None else b""
        if len(raw) > jobfiles.MAX_FILE_BYTES:
            raise TooLarge(f"A job file is at most {jobfiles.MAX_FILE_BYTES // 1024} KiB: send a shorter one")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise exceptions.ParseError(f"A job file is UTF-8 text: byte {exc.start} is not") from None
        return JobFileBody(text=text, script=self.script)


class YamlParser(_TextParser):
    media_type = "application/yaml"


# The other names YAML and shell scripts go by, as editors, curl users and CI tools send them (DRF
# picks a parser by its one media_type).
class XYamlParser(_TextParser):
    media_type = "application/x-yaml"


class TextYamlParser(_TextParser):
    media_type = "text/yaml"


class TextXYamlParser(_TextParser):
    media_type = "text/x-yaml"


class ShellScriptParser(_TextParser):
    media_type = "text/x-shellscript"
    script = True


class XShParser(_TextParser):
    media_type = "application/x-sh"
    script = True


class TextXShParser(_TextParser):
    media_type = "text/x-sh"
    script = True


JOB_FILE_PARSERS = [YamlParser, XYamlParser, TextYamlParser, TextXYamlParser, ShellScriptParser, XShParser, TextXShParser]


class NeverRunnable(exceptions.APIException):
    """The admission check says the job can never run here (too big, a GPU type the cluster lacks, over a limit).

    ``fields`` names the field it is about where there is one (``gpu_type``), as a bad field's error does.
    """

    status_code = status.HTTP_400_BAD_REQUEST
    default_code = "never_runnable"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or {}


def _never_runnable(exc: ValidationError) -> NeverRunnable | None:
    """The ValidationError as a NeverRunnable when all it says is that the job can never run, else None.

    job_submit and _validate_spec say so with messages that start with NEVER_RUNS (scheduling/services/submit.py):
    a non-field one from the admission check, or one on gpu_type; a typed exception from the service would
    be cleaner, and this keeps the two in step meanwhile.
    """
    by_field = {("non_field_errors" if k == "__all__" else k): v for k, v in getattr(exc, "message_dict", {}).items()}
    messages = [m for ms in by_field.values() for m in ms]
    if not messages or not all(m.startswith(NEVER_RUNS) for m in messages):
        return None
    return NeverRunnable(messages[0], fields={k: v for k, v in by_field.items() if k != "non_field_errors"})


def _submit(user: User, spec: JobSpec, *, key: str | None = None, copied_from: Job | None = None) -> Job:
    """job_submit, with "can never run" told apart from bad fields (`yard submit --wait` exits with its own code)."""
    try:
        return job_submit(user=user, spec=spec, idempotency_key=key, copied_from=copied_from)
    except ValidationError as exc:
        never = _never_runnable(exc)
        if never is not None:
            raise never from None
        raise


def _submit_once(user: User, spec: JobSpec, *, key: str | None) -> tuple[Job, bool]:
    """(the job, whether this request made it): _submit under the Idempotency-Key lock. A job this call
    made carries its submit event (job_submit sets it); one found for the key, a replay, does not, so
    telling the two apart costs no query of its own."""
    with _one_at_a_time(user, key):
        job = _submit(user, spec, key=key)
    return job, hasattr(job, "submit_event")


def _submit_array_once(user: User, spec: JobSpec, *, array: str, key: str | None) -> ArraySubmitted:
    """job_array_submit under the same Idempotency-Key lock, "can never run" told apart as _submit does."""
    with _one_at_a_time(user, key):
        try:
            return job_array_submit(user=user, spec=spec, array=array, idempotency_key=key)
        except ValidationError as exc:
            never = _never_runnable(exc)
            if never is not None:
                raise never from None
            raise


@contextmanager
def _one_at_a_time(user: User, key: str | None) -> Iterator[None]:
    """Serialise the requests that carry one user's Idempotency-Key, so each tells a replay from a first.

    Without it six concurrent POSTs with one key all look for the key before any has created its job,
    one creates it, the others meet the unique constraint and return that job, and all six answer 201.
    Under the lock the first answers 201 and every later one finds the job and answers 200. PostgreSQL:
    a transaction-level advisory lock on the (user, key) pair (other keys and users never wait);
    SQLite (the demo) serialises writing transactions anyway.
    """
    with transaction.atomic():
        if key is not None and connection.vendor == "postgresql":
            digest = hashlib.blake2b(f"idempotency:{user.pk}:{key}".encode(), digest_size=8).digest()
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [int.from_bytes(digest, "big", signed=True)])
        yield


def _gpu_types() -> list[str]:
    """The GPU types this cluster knows (its nodes' and its quotas'): the partitions of a Slurm script."""
    types = set(Node.objects.values_list("gpu_type", flat=True)) | set(Quota.objects.values_list("gpu_type", flat=True))
    return sorted(t for t in types if t)


def _only_team(user: Any) -> str | None:
    teams = list(teams_submittable(user=user).filter(kind=UnitKind.TEAM).values_list("slug", flat=True)[:2])
    return teams[0] if len(teams) == 1 else None


def _translation(request: Request) -> jobfiles.Translation | None:
    """The job file in the request, translated; None for the API's own JSON body."""
    data = request.data
    defaults = {"team": request.query_params.get("team") or None, "name": request.query_params.get("name") or None}
    try:
        if isinstance(data, JobFileBody):
            translation = jobfiles.translate(fmt="slurm" if data.script else "auto", text=data.text, gpu_types=_gpu_types())
        elif isinstance(data, Mapping) and "format" in data:
            envelope = s.JobFileIn(data=data)
            envelope.is_valid(raise_exception=True)
            e = envelope.validated_data
            defaults = {"team": e.get("team") or defaults["team"], "name": e.get("name") or defaults["name"]}
            translation = jobfiles.translate(fmt=e["format"], text=e["file"], gpu_types=_gpu_types())
        elif isinstance(data, Mapping) and "apiVersion" in data:
            # a Kubeflow manifest (or a job file with its apiVersion) sent as JSON, as kubectl can
            translation = jobfiles.translate(fmt="auto", data=dict(data), gpu_types=_gpu_types())
        else:
            return None
    except jobfiles.JobFileInvalid as exc:
        # The translators are pure (no Django): their refusal becomes the API's field errors here, a 400 naming
        # each place in the file (scheduling/api/errors.py), as the service's ValidationErrors do.
        raise ValidationError(exc.message_dict) from exc
    jobfiles.apply_defaults(translation, only_team=lambda: _only_team(request.user), **defaults)
    return translation


def _submission(request: Request) -> tuple[dict[str, Any], jobfiles.Translation | None]:
    """The job fields of a submit request (the API's JSON, or a job file translated), validated as the API does."""
    translation = _translation(request)
    if translation is None:
        body = s.JobSubmitIn(data=request.data)
        body.is_valid(raise_exception=True)
        return dict(body.validated_data), None
    body = s.JobSubmitIn(data=translation.fields)
    valid = body.is_valid()
    # "This field is required", said in the file's own terms (#SBATCH --account=TEAM)
    problems = {**({} if valid else jobfiles.located(body.errors, translation)), **jobfiles.missing_hints(translation)}
    if problems:
        raise ValidationError(problems)
    return dict(body.validated_data), translation
