"""The agent API's request bodies, declared once: validated on every call and published as OpenAPI.

A heartbeat arrives from every node every few seconds, so validation is plain Python over a small
declarative schema (a DRF serializer of a nested heartbeat cost several milliseconds of CPU); the same
declarations generate the agent API's OpenAPI document (GET /api/agent/v1/schema), so the contract a
fuzzer checks is the one the server enforces.

Every number is bounded: integers fit their database columns, telemetry lies within physical limits,
times within 1970..2100, lists are capped. A value outside its bounds is refused with the field's
path and what is allowed, never stored (one absurd reading must not skew reports or the idle reaper).
Unknown keys are ignored, so a newer agent may send fields this portal does not know yet.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
EPOCH_MAX = 4_102_444_800.0  # 2100-01-01: a time beyond it is a broken clock or garbage


class Invalid(Exception):
    """The body breaks the schema: ``errors`` maps a field path ("tasks[3].pid") to messages."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {', '.join(v)}" for k, v in errors.items()))
        self.errors = errors


@dataclass(frozen=True)
class Int:
    minimum: int = 0
    maximum: int = INT32_MAX
    nullable: bool = False
    description: str = ""

    def check(self, value: Any) -> str | None:
        if type(value) is not int:  # bool is an int subclass; 3.0 is not an integer on this wire
            return "must be an integer"
        if not self.minimum <= value <= self.maximum:
            return f"must be between {self.minimum} and {self.maximum}"
        return None

    def openapi(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True)
class Float:
    minimum: float
    maximum: float
    nullable: bool = True
    description: str = ""

    def check(self, value: Any) -> str | None:
        if type(value) not in (int, float):
            return "must be a number"
        # An int compares exactly whatever its size (math.isfinite(10**400) raises OverflowError); a float
        # may be NaN or infinite (JSON's NaN, Infinity, 1e999), which no bound refuses on its own.
        if type(value) is float and not math.isfinite(value):
            return f"must be a finite number between {self.minimum:g} and {self.maximum:g}"
        if not self.minimum <= value <= self.maximum:
            return f"must be between {self.minimum:g} and {self.maximum:g}"
        return None

    def openapi(self) -> dict[str, Any]:
        return {"type": "number", "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True)
class Str:
    max_length: int
    min_length: int = 0
    nullable: bool = False
    pattern: str | None = None
    choices: tuple[str, ...] = ()
    allow_nul: bool = False
    description: str = ""

    def check(self, value: Any) -> str | None:
        if type(value) is not str:
            return "must be a string"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(self.choices)}"
        if not self.min_length <= len(value) <= self.max_length:
            return f"must be {self.min_length} to {self.max_length} characters"
        if not self.allow_nul and "\x00" in value:
            return "must not contain NUL characters"
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            return f"must match {self.pattern}"
        return None

    def openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "string", "minLength": self.min_length, "maxLength": self.max_length}
        if self.choices:
            out["enum"] = list(self.choices)
        if self.pattern is not None:
            out["pattern"] = f"^{self.pattern}$"
        return out


@dataclass(frozen=True)
class Bool:
    nullable: bool = True
    description: str = ""

    def check(self, value: Any) -> str | None:
        return None if type(value) is bool else "must be true or false"

    def openapi(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class List:
    item: Spec
    max_items: int
    min_items: int = 0
    nullable: bool = False
    description: str = ""

    def openapi(self) -> dict[str, Any]:
        return {"type": "array", "items": openapi(self.item), "minItems": self.min_items, "maxItems": self.max_items}


@dataclass(frozen=True)
class Prop:
    spec: Spec
    required: bool = False
    default: Any = None


@dataclass(frozen=True)
class Obj:
    props: Mapping[str, Prop] = field(default_factory=dict)
    nullable: bool = False
    description: str = ""

    def openapi(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "object", "properties": {k: openapi(p.spec) for k, p in self.props.items()}}
        required = [k for k, p in self.props.items() if p.required]
        if required:
            out["required"] = required
        return out


Spec = Int | Float | Str | Bool | List | Obj


def openapi(spec: Spec) -> dict[str, Any]:
    out = spec.openapi()
    if spec.description:
        out["description"] = spec.description
    if spec.nullable:
        out = {**out, "nullable": True}
    return out


def parse(body: bytes) -> Any:
    """A request body as JSON (empty: null); raises Invalid, naming "body", for text that is not JSON or
    nests deeper than Python's decoder recurses (a 1 MiB body of "[" is a RecursionError otherwise)."""
    try:
        return json.loads(body or b"null")
    except (ValueError, RecursionError):  # ValueError covers an integer of over 4300 digits too
        raise Invalid({"body": ["not valid JSON"]}) from None


def validate(spec: Obj, data: Any) -> dict[str, Any]:
    """``data`` checked against ``spec``, with defaults filled in; raises Invalid naming every bad field."""
    errors: dict[str, list[str]] = {}
    value = _value(spec, data, "", errors)
    if errors:
        raise Invalid(errors)
    assert isinstance(value, dict)
    return value


def _value(spec: Spec, data: Any, path: str, errors: dict[str, list[str]]) -> Any:
    if data is None:
        if not spec.nullable:
            errors.setdefault(path or "body", []).append("must not be null")
        return None
    if isinstance(spec, Obj):
        if not isinstance(data, dict):
            errors.setdefault(path or "body", []).append("must be a JSON object")
            return None
        out: dict[str, Any] = {}
        for name, prop in spec.props.items():
            where = f"{path}.{name}" if path else name
            if name not in data:
                if prop.required:
                    errors.setdefault(where, []).append("is required")
                out[name] = prop.default() if callable(prop.default) else prop.default
            else:
                out[name] = _value(prop.spec, data[name], where, errors)
        return out
    if isinstance(spec, List):
        if not isinstance(data, list):
            errors.setdefault(path, []).append("must be a list")
            return []
        if not spec.min_items <= len(data) <= spec.max_items:
            errors.setdefault(path, []).append(f"must hold {spec.min_items} to {spec.max_items} items, not {len(data)}")
            return []
        return [_value(spec.item, item, f"{path}[{i}]", errors) for i, item in enumerate(data)]
    problem = spec.check(data)
    if problem is not None:
        errors.setdefault(path, []).append(problem)
        return None
    return float(data) if isinstance(spec, Float) else data


# --------------------------------------------------------------------------- the bodies

TIME = Float(0.0, EPOCH_MAX, description="epoch seconds")
OPT_TIME = Float(0.0, EPOCH_MAX, nullable=True, description="epoch seconds")
GPU_INDEX = Int(0, 255)
# Physical bounds of what NVML reports (an H200 has 141 GiB; the most power-hungry boards draw ~1.2 kW).
CLOCK_OFFSET = Float(-EPOCH_MAX, EPOCH_MAX, nullable=True, description="seconds, the portal's clock minus the agent's")
UTIL = Float(0.0, 100.0, description="percent")
MEMORY_MB = Float(0.0, 16 * 1024 * 1024, description="MiB")
TEMPERATURE_C = Float(-60.0, 200.0, description="°C")
POWER_W = Float(0.0, 10_000.0, description="W")
CPU_USED = Float(0.0, 8192.0, description="CPU cores busy over the last heartbeat interval")  # Linux's most CPUs
XID = Int(0, INT32_MAX, description="an NVIDIA XID error code")
MAX_XIDS_PER_GPU = 100
MAX_GPUS = 128  # MIG: up to 7 instances of each of 16 GPUs
MAX_TASKS = 1024
MAX_WINDOWS = 4096  # a node's GPUs × the minutes an agent keeps while the portal is unreachable

GPU_SAMPLE = Obj(
    {
        "index": Prop(GPU_INDEX, required=True),
        "utilization_pct": Prop(UTIL),
        "memory_used_mb": Prop(MEMORY_MB),
        "temperature_c": Prop(TEMPERATURE_C),
        "power_w": Prop(POWER_W),
        "xid_errors": Prop(List(XID, MAX_XIDS_PER_GPU), default=list),
    }
)
GPU_WINDOW = Obj(
    {
        "index": Prop(GPU_INDEX, required=True),
        "start": Prop(Float(0.0, EPOCH_MAX, nullable=False, description="epoch seconds of the minute's start"), required=True),
        "samples": Prop(Int(1, 100_000), required=True),
        "utilization_sum": Prop(Float(0.0, 100.0 * 100_000, nullable=False), required=True),
        "utilization_max": Prop(Float(0.0, 100.0, nullable=False), required=True),
        "memory_used_max_mb": Prop(Float(0.0, 16 * 1024 * 1024, nullable=False), default=0.0),
    },
    description="One GPU's telemetry folded over one minute by the agent (sent once the minute is over).",
)
NOTEBOOK = Obj(
    {
        # Its token is sealed before it is stored (scheduling/notebook_secrets.py): what fits Task.notebook_url.
        "url": Prop(Str(700, nullable=True)),
        "kernel_busy": Prop(Bool()),
        "last_activity": Prop(OPT_TIME),
        "kernels": Prop(Int(0, 100_000, nullable=True)),
        "connections": Prop(Int(0, 100_000, nullable=True)),
    },
    nullable=True,
)
SERVICE = Obj(
    {
        # Where rank 0 serves (http://address:port), whether its readiness probe passes now, whether its
        # liveness probe does (null: none configured or not probed yet), and its in-place restarts.
        "url": Prop(Str(300, nullable=True)),
        "ready": Prop(Bool()),
        "live": Prop(Bool()),
        "restarts": Prop(Int(0, INT32_MAX), default=0),
        "last_restart_at": Prop(OPT_TIME),
        "last_exit_code": Prop(Int(-255, 255, nullable=True)),
        "crash_looping": Prop(Bool(nullable=False), default=False),
        # The agent's words on its last restart or failed probe.
        "message": Prop(Str(1000, nullable=True)),
    },
    nullable=True,
    description="A service replica's state on its node (docs/services.md): probes and in-place restarts.",
)
DEV = Obj(
    {
        # Where the session's sshd listens (address:port, for the portal's tunnel), its host public key
        # ("ssh-ed25519 AAAA…"), the SSH connections open now and the newest activity on any of them.
        "endpoint": Prop(Str(300, nullable=True)),
        # The account sshd lets in (the owner's under --run-as-owner, else the agent's own: root).
        "login": Prop(Str(64, nullable=True)),
        "host_key": Prop(Str(1000, nullable=True)),
        "connections": Prop(Int(0, 100_000, nullable=True)),
        "last_activity": Prop(OPT_TIME),
    },
    nullable=True,
    description="A dev session's sshd on its node (docs/dev-sessions.md).",
)
TASK_REPORT = Obj(
    {
        "task_id": Prop(Int(1, INT64_MAX), required=True),
        "attempt": Prop(Int(1, INT32_MAX), required=True),
        "state": Prop(Str(16, choices=("running", "stopping", "exited")), required=True),
        "pid": Prop(Int(0, INT32_MAX, nullable=True)),
        "started_at": Prop(OPT_TIME),
        "checkpoint_time": Prop(OPT_TIME),
        "notebook": Prop(NOTEBOOK),
        "service": Prop(SERVICE),
        "dev": Prop(DEV),
        # The task's real use, measured by its agent (its cgroup, else /proc): null or absent when not measured.
        "cpu_used": Prop(CPU_USED),
        "memory_used_mb": Prop(MEMORY_MB),
        "memory_peak_mb": Prop(MEMORY_MB),
    }
)
HEARTBEAT = Obj(
    {
        "gpus": Prop(List(GPU_SAMPLE, MAX_GPUS), default=list),
        "windows": Prop(List(GPU_WINDOW, MAX_WINDOWS), default=list),
        "tasks": Prop(List(TASK_REPORT, MAX_TASKS), default=list),
        "draining_reason": Prop(Str(1000, nullable=True)),
        # The node's disk is (nearly) full, in words: it takes no new work until this clears.
        "disk_problem": Prop(Str(1000, nullable=True)),
        # The agent's clock when it sent this, and its measured offset (portal minus agent, NTP-style):
        # the portal shifts the times in the body by it (docs/agent-api.md, "Disk and clock").
        "agent_time": Prop(OPT_TIME),
        "clock_offset_s": Prop(CLOCK_OFFSET),
        "clock_offset_error_s": Prop(Float(0.0, 86_400.0, nullable=True, description="seconds")),
        # As at registration, so a runtime installed or turned off since (and the agent restarted) is known;
        # null (an older agent): the stored one stands.
        "container_runtime": Prop(Str(32, nullable=True)),
        "container_runtime_note": Prop(Str(1000, nullable=True)),
    }
)
MIG_PROFILE_PATTERN = r"(?:(?:[0-9]+c\.)?[0-9]+g\.[0-9]+gb)?"
GPU_INFO = Obj(
    {
        "index": Prop(GPU_INDEX, required=True),
        "uuid": Prop(Str(64, min_length=1), required=True),
        "name": Prop(Str(100), default=""),
        "gpu_type": Prop(Str(32, min_length=1, pattern=r"[A-Za-z0-9][A-Za-z0-9._-]*"), required=True),
        "memory_mb": Prop(Int(0, INT32_MAX), default=0),
        "nvlink_domain": Prop(Str(40, min_length=1), required=True),
        "pcie_switch": Prop(Str(40, min_length=1), required=True),
        "numa_node": Prop(Int(0, 1024, nullable=True)),
        # A MIG instance: its profile ("1g.10gb", or "1c.3g.40gb" for a compute instance) and its
        # physical GPU's UUID; both empty for a whole GPU (docs/agent-api.md, "MIG").
        "mig_profile": Prop(Str(32, pattern=MIG_PROFILE_PATTERN), default=""),
        "parent_uuid": Prop(Str(64), default=""),
    }
)
REGISTER = Obj(
    {
        "name": Prop(Str(63, min_length=1, pattern=r"[A-Za-z0-9][A-Za-z0-9._-]*"), required=True),
        "address": Prop(Str(255), default=""),
        "leaf": Prop(Str(64, min_length=1), required=True),
        "spine": Prop(Str(64, min_length=1), required=True),
        "simulated": Prop(Bool(nullable=False), default=False),
        "agent_version": Prop(Str(32), default=""),
        # The node's cores and memory; 0 (what an older agent, which sends neither, gets) is unknown.
        "cpus": Prop(Int(0, 16_384, description="CPU cores the agent may run tasks on"), default=0),
        "memory_mb": Prop(Int(0, 64 * 1024 * 1024, description="MiB of memory (MemTotal)"), default=0),
        # The multi-node NVLink domain the node is in (its --fabric-domain, or NVML's "<clusterUuid>/<cliqueId>");
        # "" (what an older agent gets): none.
        "fabric_domain": Prop(Str(128, description="multi-node NVLink domain id, unique in the cluster"), default=""),
        # The container runtime the agent found ("runc"; "": none) and its words for it (docs/containers.md).
        "container_runtime": Prop(Str(32), default=""),
        "container_runtime_note": Prop(Str(1000), default=""),
        "gpus": Prop(List(GPU_INFO, MAX_GPUS, min_items=1), required=True),
    }
)


def register_errors(data: dict[str, Any]) -> dict[str, list[str]]:
    """What a register body validated against REGISTER breaks across its fields: GPU indices and
    UUIDs unique, one (parent) GPU type per node, each MIG instance typed "<parent type>.<profile>"
    with its parent's UUID."""
    gpus = data["gpus"]
    problems: list[str] = []
    if len({g["index"] for g in gpus}) != len(gpus):
        problems.append("GPU indices must be unique")
    if len({g["uuid"] for g in gpus}) != len(gpus):
        problems.append("GPU UUIDs must be unique")
    parents: set[str] = set()
    for g in gpus:
        profile, gpu_type = g["mig_profile"], g["gpu_type"]
        if not profile:
            parents.add(gpu_type)
            if g["parent_uuid"]:
                problems.append(f"GPU {g['index']}: parent_uuid is for MIG instances only")
        elif not gpu_type.endswith(f".{profile}") or not g["parent_uuid"]:
            problems.append(f"GPU {g['index']}: a MIG instance has gpu_type <parent type>.{profile} and a parent_uuid")
        else:
            parents.add(gpu_type.removesuffix(f".{profile}"))
    if len(parents) > 1:
        problems.append("a node holds GPUs of one type")
    return {"gpus": problems} if problems else {}


STATUS = Obj(
    {
        "attempt": Prop(Int(1, INT32_MAX), required=True),
        "state": Prop(Str(16, choices=("running", "exited")), required=True),
        "pid": Prop(Int(0, INT32_MAX, nullable=True)),
        # An exit status as a shell reports it (0..255), or what a Popen returncode says (negative: signal).
        "exit_code": Prop(Int(-255, 255, nullable=True)),
        "signal": Prop(Int(1, 128, nullable=True)),
        "stopped_by": Prop(Str(16, nullable=True, choices=("sigterm", "sigkill"))),
        "started_at": Prop(OPT_TIME),
        "ended_at": Prop(OPT_TIME),
        "notebook_url": Prop(Str(700, nullable=True)),
        "stop_cause": Prop(
            Str(
                32,
                nullable=True,
                choices=("stop", "fenced", "time_limit", "portal_unreachable", "agent_lost", "node_fault", "image_pull"),
            )
        ),
        # The agent's own one-line reason, where it gave the task one (a failed image pull: what failed and why).
        "message": Prop(Str(1000, nullable=True)),
        "checkpoint_time": Prop(OPT_TIME),
        "clock_offset_s": Prop(CLOCK_OFFSET),
    }
)
LOGS = Obj(
    {
        "attempt": Prop(Int(1, INT32_MAX), required=True),
        "offset": Prop(Int(0, INT64_MAX), required=True),
        # Log text as the workload wrote it: NUL is allowed here (the service replaces it).
        "data": Prop(Str(256 * 1024, allow_nul=True), required=True),
    }
)
DRAIN = Obj({"reason": Prop(Str(1000, min_length=1), required=True)})
