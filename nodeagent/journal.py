"""The agent's local journal: what it started, so a restarted agent adopts its workloads and never
starts the same (task, attempt) twice. One JSON file in the state dir, replaced atomically."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from nodeagent.devsession import DevInfo
from nodeagent.service import ServiceInfo

TaskState = Literal["launching", "running", "stopping", "exited"]
JOURNAL_VERSION = 1


@dataclass
class NotebookInfo:
    url: str
    port: int
    token: str
    base_url: str


@dataclass
class TaskRecord:
    task_id: int
    attempt: int
    job_id: int
    kind: str
    launch_id: str
    workdir: str
    checkpoint_dir: str
    state: TaskState = "launching"
    pid: int | None = None
    start_ticks: int | None = None
    started_at: float | None = None
    time_limit_s: float | None = None
    grace_s: float = 60.0
    gpus: list[int] = field(default_factory=list)
    notebook: NotebookInfo | None = None
    # stopping
    stop_cause: str | None = None
    stop_reason: str | None = None
    stop_deadline: float | None = None
    sigterm_at: float | None = None
    sigkill_at: float | None = None
    # result
    exit_code: int | None = None
    signal: int | None = None
    stopped_by: str | None = None
    ended_at: float | None = None
    # reporting to the portal
    running_reported: bool = False
    exit_reported: bool = False
    log_file_pos: int = 0
    log_offset: int = 0
    log_closed: bool = False
    # The local account the task runs as (--run-as-owner), or None: it runs as the agent's user.
    run_as: str | None = None
    # A task in a container: {"image", "digest"} and its runtime's ref (containers/runtime.py from_ref).
    container: dict[str, Any] | None = None
    # A one-line reason the agent gives with an end it made itself (a launch that failed).
    message: str | None = None
    # A service replica (kind "service"): its port, probes and in-place restarts (nodeagent/service.py).
    service: ServiceInfo | None = None
    # A dev session (kind "dev"): its sshd's folder, port, host key and keys (nodeagent/devsession.py).
    dev: DevInfo | None = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.task_id, self.attempt)

    @property
    def log_path(self) -> Path:
        return Path(self.workdir) / "output.log"

    @property
    def exit_file(self) -> Path:
        return Path(self.workdir) / "exit-status"

    @property
    def run_dir(self) -> Path:
        """The task's working directory. Run as its owner, a task gets a subdirectory it owns, and the
        files the agent reads or writes as root (log, exit status) stay where the task cannot swap
        them for links."""
        return Path(self.workdir) / "work" if self.run_as else Path(self.workdir)

    @property
    def fenced_marker(self) -> Path:
        """Written by the node's watchdog when it stopped the task because its agent was gone."""
        return Path(self.workdir) / "fenced"

    @property
    def util_file(self) -> Path:
        return Path(self.workdir) / "sim-util"

    @property
    def live(self) -> bool:
        return self.state in ("launching", "running", "stopping")

    @property
    def settled(self) -> bool:
        """Ended, and the portal has been told (or refused to hear of it)."""
        return self.state == "exited" and self.exit_reported

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskRecord:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("notebook") is not None:
            values["notebook"] = NotebookInfo(**values["notebook"])
        if values.get("service") is not None:
            known_service = {f.name for f in fields(ServiceInfo)}
            values["service"] = ServiceInfo(**{k: v for k, v in values["service"].items() if k in known_service})
        if values.get("dev") is not None:
            known_dev = {f.name for f in fields(DevInfo)}
            values["dev"] = DevInfo(**{k: v for k, v in values["dev"].items() if k in known_dev})
        return cls(**values)


@dataclass
class JournalData:
    last_contact: float | None = None
    # Which node identity wrote it (a hash of the node token): task ids are only unique per portal.
    identity: str | None = None
    tasks: list[TaskRecord] = field(default_factory=list)


def atomic_write(path: Path, text: str, *, mode: int = 0o600) -> None:
    """Write via a temporary file, fsync and rename: a crash leaves the old file or the new one.

    0600 by default: the journal holds notebook servers' tokens, the identity files the node token;
    nothing the agent writes this way is for other local users."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load(path: Path) -> JournalData:
    if not path.exists():
        return JournalData()
    raw = json.loads(path.read_text())
    return JournalData(
        last_contact=raw.get("last_contact"),
        identity=raw.get("identity"),
        tasks=[TaskRecord.from_json(item) for item in raw.get("tasks", [])],
    )


def save(path: Path, data: JournalData) -> None:
    payload = {
        "version": JOURNAL_VERSION,
        "last_contact": data.last_contact,
        "identity": data.identity,
        "tasks": [asdict(record) for record in data.tasks],
    }
    atomic_write(path, json.dumps(payload, indent=1))
