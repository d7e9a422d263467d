"""What every job-file translator shares: the translation it returns, the errors it raises (all at once, keyed
by the place in the file), the safe YAML reader, and the checks of keys, whole numbers, lists, Kubernetes
quantities and environment variables.

Plain Python over the parsed file, as all of scheduling/jobfiles: no Django, no database, no I/O.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

FORMATS = ("yardmaster", "pytorchjob", "mpijob", "slurm")
YAML_MEDIA_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml")
SCRIPT_MEDIA_TYPES = ("text/x-shellscript", "application/x-sh", "text/x-sh")
MAX_FILE_BYTES = 1024 * 1024

# The API's own input fields (JobSubmitIn): a Yardmaster job file may hold these and nothing else.
JOB_FIELDS = (
    "name", "team", "tier", "replicas", "gpus_per_replica", "gpu_type", "command", "env",
    "time_limit_s", "checkpoint_dir", "priority", "leaf_locality", "one_fabric", "one_per_node",
    "image", "container_mounts", "container_workdir", "array",
)  # fmt: skip
YARDMASTER_API_VERSION = "yardmaster.io/v1"
KUBEFLOW_API_VERSION = "kubeflow.org/v1"
MPI_V2_API_VERSION = "kubeflow.org/v2beta1"  # the mpi-operator's MPIJob since v0.3: the same fields as v1's here
TIER_WORDS = {
    "1": 1, "production": 1, "prod": 1, "high": 1,
    "2": 2, "research": 2, "normal": 2, "standard": 2,
    "3": 3, "spot": 3, "low": 3, "scavenger": 3, "preemptible": 3,
}  # fmt: skip


class JobFileInvalid(Exception):
    """A job file that cannot be translated: what to change, keyed by the place in the file, all of it at once.

    ``message_dict`` and ``messages`` read as Django's ValidationError's do: the API says it as one
    (scheduling/api/submission.py), a 400 naming each place with these words.
    """

    def __init__(self, message_dict: Mapping[str, list[str]]) -> None:
        self.message_dict: dict[str, list[str]] = {place: list(messages) for place, messages in message_dict.items()}
        super().__init__(self.message_dict)

    @property
    def messages(self) -> list[str]:
        return [message for messages in self.message_dict.values() for message in messages]


@dataclass
class Translation:
    """What a job file asks for, as the API's job fields, with the warnings to show the submitter.

    ``origin`` maps a job field to the place in the file it came from, so a field the API's own
    validation refuses is reported where the user wrote it (``#SBATCH --gpus-per-node=32``).
    """

    source: str
    fields: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    origin: dict[str, str] = field(default_factory=dict)
    on_failure: bool = False  # a Kubeflow restartPolicy OnFailure is honoured (runPolicy.backoffLimit counts its restarts)

    def set(self, name: str, value: Any, origin: str) -> None:
        self.fields[name] = value
        self.origin[name] = origin


class Errors:
    """Errors keyed by where they are in the file; raised all at once, as the API does for fields."""

    def __init__(self) -> None:
        self.by_place: dict[str, list[str]] = {}

    def add(self, place: str, message: str) -> None:
        self.by_place.setdefault(place, []).append(message)

    def raise_any(self) -> None:
        if self.by_place:
            raise JobFileInvalid(self.by_place)


class _NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases: a job file has no use for them, and a few bytes of nested
    aliases stand for billions of nodes once something walks the document."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted in job files", event.start_mark)
        return super().compose_node(parent, index)


def refuse(place: str, message: str) -> JobFileInvalid:
    return JobFileInvalid({place: [message]})


def parse_yaml(text: str) -> Any:
    """One YAML (or JSON) document, safely: no tags, no anchors or aliases (a few bytes of aliases can
    stand for billions of nodes), at most MAX_FILE_BYTES."""
    if len(text.encode("utf-8", errors="replace")) > MAX_FILE_BYTES:
        raise refuse("file", f"A job file is at most {MAX_FILE_BYTES // 1024} KiB")
    try:
        documents = [d for d in yaml.load_all(text, Loader=_NoAliasLoader) if d is not None]
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise refuse("file", f"Not valid YAML{where}: {exc.problem or exc}") from None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise refuse("file", f"Not valid YAML: {str(exc)[:200]}") from None
    if len(documents) != 1:
        raise refuse("file", f"Send one job per file: this one has {len(documents)} YAML documents")
    return documents[0]


# A key in check_keys' table of what a mapping may hold: OK (honoured, or accepted because its meaning is kept),
# the reason it is ignored (accepted with that warning: ignoring it does not change what the job computes), or
# None (refused).
OK = "ok"


def check_keys(
    where: str, value: Any, allowed: Mapping[str, Any], refused: Mapping[str, str], out: Translation, errors: Errors
) -> dict[str, Any]:
    """The mapping at ``where`` with its keys sorted into honoured, warned about and refused."""
    if not isinstance(value, Mapping):
        errors.add(where, "must be a mapping")
        return {}
    for key in value:
        place = f"{where}.{key}"
        if key in refused:
            errors.add(place, f"cannot be honoured: {refused[key]}")
        elif key not in allowed:
            errors.add(place, "is not a field Yardmaster knows here: remove it (nothing is ignored silently)")
        elif allowed[key] is None:
            errors.add(place, "cannot be honoured by Yardmaster: remove it")
        elif allowed[key] != OK:
            out.warnings.append(f"{place} is ignored: {allowed[key]}")
    return dict(value)


def int_value(place: str, value: Any, errors: Errors, *, minimum: int = 0) -> int | None:
    if isinstance(value, bool):
        errors.add(place, "must be a whole number")
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or value < minimum:
        errors.add(place, f"must be a whole number of at least {minimum}")
        return None
    return value


def string_list(place: str, value: Any, errors: Errors) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value):
        errors.add(place, "must be a list of strings")
        return None
    return [str(v) for v in value]


# Kubernetes quantities: cores (8, 7.5, 500m) and bytes (64Gi, 512Mi, 1G, 1e9), as Yardmaster's cores and MiB.
_QUANTITY = re.compile(r"(\d+(?:\.\d+)?(?:[eE]\d+)?)(m|Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?")
_BYTES = {None: 1, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
          "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5}  # fmt: skip


def quantity(where: str, amount: Any, *, memory: bool, errors: Errors) -> int | None:
    """A pod's cpu (whole cores, rounded up) or memory (MiB, rounded up) request or limit."""
    match = _QUANTITY.fullmatch(str(amount).strip())
    unit = match.group(2) if match else None
    if match is None or (unit == "m" if memory else unit not in (None, "m")):
        errors.add(where, "is not a Kubernetes quantity (e.g. cpu: 8 or 500m; memory: 64Gi)")
        return None
    number = float(match.group(1))
    if memory:
        return max(1, math.ceil(number * _BYTES[unit] / 1024**2))
    return max(1, math.ceil(number / 1000 if unit == "m" else number))


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def read_env(place: str, value: Any, errors: Errors) -> dict[str, str]:
    env: dict[str, str] = {}
    if value is None:
        return env
    if not isinstance(value, list):
        errors.add(place, "must be a list of {name, value}")
        return env
    for i, item in enumerate(value):
        where = f"{place}[{i}]"
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            errors.add(where, "must be {name: ..., value: ...}")
            continue
        if "valueFrom" in item:
            errors.add(
                f"{where}.valueFrom",
                f"cannot be honoured for {item['name']}: Secrets, ConfigMaps and the downward API do not exist here; "
                "give the value",
            )
            continue
        extra = set(item) - {"name", "value"}
        if extra:
            errors.add(where, f"unknown keys {', '.join(sorted(map(str, extra)))}")
        raw = item.get("value", "")
        if isinstance(raw, Mapping | list) or (raw is None and "value" in item):
            errors.add(f"{where}.value", "must be a string")
            continue
        env[item["name"]] = str(raw).lower() if isinstance(raw, bool) else str(raw)
    return env
