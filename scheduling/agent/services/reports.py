"""What agents send, as the services take it: registration, heartbeat and status reports, with their
times shifted into the portal's clock by the node's measured offset; the errors the services raise."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from django.conf import settings
from django.utils import timezone

from scheduling.models import (
    Task,
)

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    gpu_type: str
    memory_mb: int
    nvlink_domain: str
    pcie_switch: str
    numa_node: int | None
    # A MIG instance (its gpu_type is then "<parent type>.<profile>"); both empty for a whole GPU.
    mig_profile: str = ""
    parent_uuid: str = ""

    @property
    def parent_type(self) -> str:
        """The physical GPU's type: "H100" for an H100 and for each of its MIG instances."""
        return self.gpu_type.removesuffix(f".{self.mig_profile}") if self.mig_profile else self.gpu_type


@dataclass(frozen=True)
class Registration:
    name: str
    address: str
    leaf: str
    spine: str
    simulated: bool
    agent_version: str
    gpus: Sequence[GpuInfo]
    # 0: unknown (an agent older than these fields); the scheduler then does not limit by it.
    cpus: int = 0
    memory_mb: int = 0
    fabric_domain: str = ""  # the multi-node NVLink domain it is in; "": none
    container_runtime: str = ""  # the container runtime its agent found ("runc"); "": none
    container_runtime_note: str = ""


@dataclass(frozen=True)
class GpuSample:
    index: int
    utilization_pct: float | None = None
    memory_used_mb: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    xid_errors: Sequence[int] = ()


@dataclass(frozen=True)
class NotebookReport:
    url: str | None = None
    kernel_busy: bool | None = None
    last_activity: float | None = None


@dataclass(frozen=True)
class ServiceReport:
    """A service replica's rank 0 on its node: where it serves, its probes, its in-place restarts."""

    url: str | None = None
    ready: bool | None = None
    live: bool | None = None
    restarts: int = 0
    last_restart_at: float | None = None
    last_exit_code: int | None = None
    crash_looping: bool = False
    message: str | None = None


@dataclass(frozen=True)
class DevReport:
    """A dev session's sshd on its node: where it listens, its host key, its connections."""

    endpoint: str | None = None
    login: str | None = None
    host_key: str | None = None
    connections: int | None = None
    last_activity: float | None = None


@dataclass(frozen=True)
class GpuWindowReport:
    """One GPU's minute, folded by the agent: what GpuWindow stores, sent once the minute is over."""

    index: int
    start: float
    samples: int
    utilization_sum: float
    utilization_max: float
    memory_used_max_mb: float = 0.0


@dataclass(frozen=True)
class TaskReport:
    task_id: int
    attempt: int
    state: str  # "running", "stopping" or "exited": the agent's local view
    checkpoint_time: float | None = None
    notebook: NotebookReport | None = None
    service: ServiceReport | None = None
    dev: DevReport | None = None
    pid: int | None = None
    started_at: float | None = None
    # Real use as the agent measured it; None: not measured this time (the stored value stays).
    cpu_used: float | None = None
    memory_used_mb: float | None = None
    memory_peak_mb: float | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.task_id, self.attempt)


@dataclass(frozen=True)
class Heartbeat:
    gpus: Sequence[GpuSample] = ()
    tasks: Sequence[TaskReport] = ()
    draining_reason: str | None = None
    windows: Sequence[GpuWindowReport] = ()
    disk_problem: str | None = None  # the node's disk is (nearly) full: it takes no new work meanwhile
    clock_skew_s: float | None = None  # the agent's clock minus the portal's, as measured; None: not known
    container_runtime: str | None = None  # the runtime the agent found ("": none); None: not said (an older agent)
    container_runtime_note: str | None = None


# A node's clock is corrected from this skew on (NTP keeps a healthy node within milliseconds, and
# below a second nothing a person reads changes); the cluster page shows it from SKEW_SHOWN_S.
SKEW_CORRECTED_S = 1.0
SKEW_SHOWN_S = 2.0


def clock_offset(data: dict[str, Any], *, received: float) -> float | None:
    """The portal's clock minus the agent's: the agent's own estimate (from round trips, NTP's way), else
    what its ``agent_time`` says against ``received`` (off by the one-way delay); None if neither is sent."""
    if data.get("clock_offset_s") is not None:
        return float(data["clock_offset_s"])
    if data.get("agent_time") is not None:
        return received - float(data["agent_time"])
    return None


def _shift(value: float | None, offset: float | None) -> float | None:
    """An agent's epoch time in the portal's clock."""
    if value is None or offset is None or abs(offset) < SKEW_CORRECTED_S:
        return value
    return value + offset


def _window_shift(offset: float | None) -> float:
    """Windows stay aligned to whole windows (the reaper and reports read them so): a whole number of them."""
    if offset is None or abs(offset) < SKEW_CORRECTED_S:
        return 0.0
    size = float(cast(float, settings.YARD["TELEMETRY_WINDOW_S"]))
    return round(offset / size) * size


def heartbeat_from(data: dict[str, Any], *, received: float | None = None) -> Heartbeat:
    """A Heartbeat from a body validated against protocol.HEARTBEAT, its times in the portal's clock."""
    offset = clock_offset(data, received=timezone.now().timestamp() if received is None else received)
    window_shift = _window_shift(offset)
    return Heartbeat(
        gpus=[GpuSample(**gpu) for gpu in data["gpus"]],
        windows=[GpuWindowReport(**{**w, "start": w["start"] + window_shift}) for w in data["windows"]],
        disk_problem=data.get("disk_problem") or None,
        clock_skew_s=None if offset is None else -offset,
        tasks=[
            TaskReport(
                task_id=t["task_id"],
                attempt=t["attempt"],
                state=t["state"],
                checkpoint_time=_shift(t["checkpoint_time"], offset),
                pid=t["pid"],
                started_at=_shift(t["started_at"], offset),
                cpu_used=t["cpu_used"],
                memory_used_mb=t["memory_used_mb"],
                memory_peak_mb=t["memory_peak_mb"],
                notebook=NotebookReport(
                    url=t["notebook"]["url"],
                    kernel_busy=t["notebook"]["kernel_busy"],
                    last_activity=_shift(t["notebook"]["last_activity"], offset),
                )
                if t["notebook"]
                else None,
                service=ServiceReport(**{**t["service"], "last_restart_at": _shift(t["service"]["last_restart_at"], offset)})
                if t.get("service")
                else None,
                dev=DevReport(**{**t["dev"], "last_activity": _shift(t["dev"]["last_activity"], offset)})
                if t.get("dev")
                else None,
            )
            for t in data["tasks"]
        ],
        draining_reason=data["draining_reason"] or None,
        container_runtime=data.get("container_runtime"),
        container_runtime_note=data.get("container_runtime_note"),
    )


@dataclass(frozen=True)
class StatusReport:
    attempt: int
    state: str  # "running" | "exited"
    pid: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    stopped_by: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    notebook_url: str | None = None
    stop_cause: str | None = None  # why the agent stopped it on its own account (docs/agent-api.md)
    checkpoint_time: float | None = None  # the newest checkpoint, read after the workload exited
    message: str | None = None  # the agent's one-line reason (a failed image pull), for the job's events


def status_from(data: dict[str, Any]) -> StatusReport:
    """A StatusReport from a body validated against protocol.STATUS, its times in the portal's clock
    (shifted by the offset the agent measured, if it sends one)."""
    fields = {k: v for k, v in data.items() if k != "clock_offset_s"}
    offset = data.get("clock_offset_s")
    for name in ("started_at", "ended_at", "checkpoint_time"):
        fields[name] = _shift(fields.get(name), offset)
    return StatusReport(**fields)


@dataclass
class HeartbeatResult:
    node_state: str
    live_tasks: list[Task] = field(default_factory=list)
    desired: list[dict[str, Any]] = field(default_factory=list)


class NodeExists(Exception):
    """A node of that name is registered already."""


class TaskNotFound(Exception):
    """No such task on this node (another node's task is reported the same as a missing one)."""


class StaleAttempt(Exception):
    """The report is about an attempt that is not live on this node any more."""


def epoch(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=UTC)
