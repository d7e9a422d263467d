"""Service replicas (docs/services.md, "On the node"): their port and URL, HTTP probes of rank 0, and
the arithmetic of in-place restarts (back-off, streaks, crash-looping).

A service task is launched like any other (nodeagent/launch.py); what differs is here:

- its server listens on the spec's ``master_port``, given as ``PORT`` and ``YARD_SERVICE_PORT`` to
  every rank, and rank 0's ``http://<address>:<port>`` is its URL;
- rank 0 is probed as Kubernetes probes a container (``httpGet``): readiness, and liveness where the
  spec names a path. Each running rank 0 has a `Prober`, a thread of its own, so a server that
  answers slowly (or not at all) never delays the agent's loop and its heartbeats;
- a rank whose process exits while nobody told it to stop is started again, in place, after a back-off
  (`ServiceInfo.crashed`): Workloads.supervise does the killing and the spawning, this module the
  counting.

What must outlive an agent restart (the restart count, the back-off's end, the spec the process is
rebuilt from) is journaled in `ServiceInfo`, on the task's record; what a prober sees now (ready, live)
is not: a restarted agent probes afresh.
"""

from __future__ import annotations

import contextlib
import http.client
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nodeagent.protocol import SERVICE_MESSAGE_MAX, SERVICE_URL_MAX

# The restart streak resets once a process has run this long (Kubernetes' CrashLoopBackOff: 10 min;
# docs/services.md: 60 s).
STREAK_RESET_S = 60.0
# Crashes in a row without becoming ready that make a replica crash-looping.
CRASH_LOOP_AFTER = 3
FIRST_BACKOFF_S = 1.0
DEFAULT_BACKOFF_MAX_S = 300.0
# At most this much of a probe's answer is read (a health endpoint that streams must not hold a probe).
PROBE_READ_BYTES = 64 * 1024


def _number(raw: Any, default: float, *, low: float, high: float) -> float:
    """A finite float within [low, high] from what the portal sent, else `default`."""
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return default
    return min(max(float(raw), low), high)


def _path(raw: Any) -> str | None:
    if not isinstance(raw, str) or not raw:
        return None
    return raw if raw.startswith("/") else "/" + raw


@dataclass(frozen=True)
class ProbeSpec:
    """The spec's "service" object (scheduling/agent/services/desired.py _service_spec), bounded: a
    value the agent cannot use is replaced by Kubernetes' default rather than failing the task."""

    readiness_path: str | None = "/"
    liveness_path: str | None = None
    period_s: float = 10.0
    timeout_s: float = 1.0
    failure_threshold: int = 3
    success_threshold: int = 1
    initial_delay_s: float = 0.0
    backoff_max_s: float = DEFAULT_BACKOFF_MAX_S

    @classmethod
    def from_spec(cls, raw: Any) -> ProbeSpec:
        data = raw if isinstance(raw, dict) else {}
        return cls(
            readiness_path=_path(data.get("readiness_path")) or "/",
            liveness_path=_path(data.get("liveness_path")),
            period_s=_number(data.get("period_s"), 10.0, low=0.05, high=3600.0),
            timeout_s=_number(data.get("timeout_s"), 1.0, low=0.05, high=3600.0),
            failure_threshold=int(_number(data.get("failure_threshold"), 3, low=1, high=1000)),
            success_threshold=int(_number(data.get("success_threshold"), 1, low=1, high=1000)),
            initial_delay_s=_number(data.get("initial_delay_s"), 0.0, low=0.0, high=86_400.0),
            backoff_max_s=_number(data.get("backoff_max_s"), DEFAULT_BACKOFF_MAX_S, low=FIRST_BACKOFF_S, high=86_400.0),
        )


def service_url(address: str, port: int) -> str | None:
    """``http://<address>:<port>`` (an IPv6 address in brackets), or None when it would not fit the report."""
    if port <= 0:
        return None
    host = f"[{address}]" if ":" in address else address
    url = f"http://{host}:{port}"
    return url if len(url) <= SERVICE_URL_MAX else None


def service_env(port: int) -> dict[str, str]:
    """What every rank of a service replica is told about its port."""
    return {"PORT": str(port), "YARD_SERVICE_PORT": str(port)} if port > 0 else {}


@dataclass
class ServiceInfo:
    """A service task's journaled state: where it serves, how it is probed, and its in-place restarts.

    ``spec`` is the task's desired entry as launched (the container's registry credential removed): a
    restart, by this agent or by one restarted meanwhile, rebuilds the command, environment and limits
    from it exactly as the launch did."""

    port: int
    url: str | None
    rank: int
    probe: dict[str, Any]
    spec: dict[str, Any]
    restarts: int = 0
    last_restart_at: float | None = None
    last_exit_code: int | None = None
    # Crashes in a row (for the back-off; reset once a process ran STREAK_RESET_S), and crashes since
    # the replica was last ready (crash-looping at CRASH_LOOP_AFTER).
    streak: int = 0
    crashes_since_ready: int = 0
    # When the current process started (the task's started_at is its first start, for the portal).
    run_started_at: float | None = None
    # While it waits to be started again: when its back-off ends; None while a process runs.
    restart_at: float | None = None
    backoff_s: float = 0.0
    message: str | None = None

    @property
    def probed(self) -> bool:
        """Rank 0 alone serves and is probed."""
        return self.rank == 0

    @property
    def crash_looping(self) -> bool:
        return self.crashes_since_ready >= CRASH_LOOP_AFTER

    def probe_spec(self) -> ProbeSpec:
        return ProbeSpec.from_spec(self.probe)

    def crashed(self, *, now: float, exit_code: int | None, ever_ready: bool) -> str:
        """Count a crash of the current process and schedule the next start; returns the log line."""
        if self.run_started_at is not None and now - self.run_started_at >= STREAK_RESET_S:
            self.streak = 0
        if ever_ready:
            self.crashes_since_ready = 0
        self.streak += 1
        self.crashes_since_ready += 1
        self.restarts += 1
        self.last_exit_code = None if exit_code is None else max(-255, min(255, exit_code))
        self.backoff_s = min(FIRST_BACKOFF_S * 2 ** min(self.streak - 1, 32), self.probe_spec().backoff_max_s)
        self.restart_at = now + self.backoff_s
        self.run_started_at = None
        code = "unknown" if exit_code is None else str(exit_code)
        return f"restart {self.restarts} after exit code {code}; next back-off {self.backoff_s:g} s"


def clip_message(text: str | None) -> str | None:
    return None if text is None else text[:SERVICE_MESSAGE_MAX]


# -- probes -------------------------------------------------------------------------------------------


def http_get(address: str, port: int, path: str, *, timeout_s: float) -> str | None:
    """One Kubernetes httpGet probe: None if it passed (an answer 200–399 within ``timeout_s``, no
    redirect followed), else why it failed, in words."""
    deadline = time.monotonic() + timeout_s
    connection = http.client.HTTPConnection(address, port, timeout=timeout_s)
    try:
        connection.request("GET", path, headers={"User-Agent": "yard-agent-probe", "Connection": "close"})
        response = connection.getresponse()
        response.read(PROBE_READ_BYTES)
        if time.monotonic() > deadline:
            return f"GET {path}: no answer within {timeout_s:g} s"
        if 200 <= response.status < 400:
            return None
        return f"GET {path}: HTTP {response.status}"
    except TimeoutError:
        return f"GET {path}: no answer within {timeout_s:g} s"
    except (OSError, http.client.HTTPException) as exc:
        return f"GET {path}: {exc.__class__.__name__}: {exc}"[:300]
    finally:
        connection.close()


Get = Callable[..., str | None]


@dataclass
class _Counter:
    """One probe's passes and failures in a row (Kubernetes' success/failure thresholds)."""

    passes: int = 0
    failures: int = 0
    last_error: str | None = None

    def add(self, error: str | None) -> None:
        if error is None:
            self.passes, self.failures = self.passes + 1, 0
        else:
            self.passes, self.failures, self.last_error = 0, self.failures + 1, error


@dataclass
class Prober:
    """Probes one process of a service's rank 0, in a thread of its own, until `stop()` or its liveness
    probe fails: then it calls `kill` (with the reason) and ends, and Workloads.supervise, seeing the
    process gone, restarts it like a crash. `on_change` is called when ready flips (a heartbeat soon)."""

    address: str
    port: int
    spec: ProbeSpec
    on_change: Callable[[], None]
    kill: Callable[[str], None]
    name: str = "probe"
    get: Get = http_get
    ready: bool = False
    live: bool | None = None
    ever_ready: bool = False
    # Why the liveness probe killed the process (None: it did not).
    killed: str | None = None
    message: str | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Prober:
        self.thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()

    def snapshot(self) -> tuple[bool, bool | None, bool, str | None]:
        """(ready, live, ever ready, message), read together."""
        with self.lock:
            return self.ready, self.live, self.ever_ready, self.message

    def _run(self) -> None:
        spec = self.spec
        readiness, liveness = _Counter(), _Counter()
        if self.stopped.wait(spec.initial_delay_s):
            return
        while not self.stopped.is_set():
            began = time.monotonic()
            readiness.add(self.get(self.address, self.port, spec.readiness_path or "/", timeout_s=spec.timeout_s))
            # Liveness counts only once the process has been ready (the readiness probe is its startup
            # probe, as a Kubernetes startupProbe): a model server loading its weights for minutes is not
            # killed for not answering yet; one that never gets ready is the rollout deadline's business.
            if spec.liveness_path is not None and self.ever_ready:
                liveness.add(self.get(self.address, self.port, spec.liveness_path, timeout_s=spec.timeout_s))
            if self.stopped.is_set():
                return  # its process is gone or being stopped: what this round saw is of no use
            changed = self._update(readiness, liveness)
            if spec.liveness_path is not None and liveness.failures >= spec.failure_threshold:
                reason = (
                    f"liveness probe failed {liveness.failures} times in a row ({liveness.last_error}): "
                    "killing the server to restart it"
                )
                with self.lock:
                    self.ready, self.killed, self.message = False, reason, reason
                self.kill(reason)
                self.on_change()
                return
            if changed:
                self.on_change()
            self.stopped.wait(max(0.0, spec.period_s - (time.monotonic() - began)))

    def _update(self, readiness: _Counter, liveness: _Counter) -> bool:
        """Fold this round into ready and live; True when ready flipped."""
        spec = self.spec
        with self.lock:
            before = self.ready
            if readiness.passes >= spec.success_threshold:
                self.ready = self.ever_ready = True
            elif readiness.failures >= spec.failure_threshold:
                self.ready = False
            if spec.liveness_path is not None:
                self.live = liveness.failures < spec.failure_threshold
            if readiness.failures:
                self.message = f"readiness probe failed {readiness.failures} time(s) in a row: {readiness.last_error}"
            elif liveness.failures:
                self.message = f"liveness probe failed {liveness.failures} time(s) in a row: {liveness.last_error}"
            elif self.ready:
                self.message = None
            return self.ready != before


class Probers:
    """The running probers of one agent's service tasks, by task."""

    def __init__(self) -> None:
        self.by_task: dict[tuple[int, int], Prober] = {}

    def start(self, key: tuple[int, int], prober: Prober) -> None:
        self.stop(key)
        self.by_task[key] = prober.start()

    def get(self, key: tuple[int, int]) -> Prober | None:
        return self.by_task.get(key)

    def stop(self, key: tuple[int, int]) -> Prober | None:
        prober = self.by_task.pop(key, None)
        if prober is not None:
            prober.stop()
        return prober

    def stop_all(self) -> None:
        for key in list(self.by_task):
            self.stop(key)

    def tasks(self) -> list[tuple[int, int]]:
        return list(self.by_task)


def report(info: ServiceInfo, prober: Prober | None, *, running: bool) -> dict[str, Any]:
    """The heartbeat's ``service`` object (scheduling/agent/protocol.py SERVICE). Rank 0 reports its
    probes; a rank that is not probed is "ready" while its process runs (it has no URL)."""
    if info.probed:
        ready, live, ever_ready, said = prober.snapshot() if prober is not None and running else (False, None, False, None)
    else:
        ready, live, ever_ready, said = running and info.restart_at is None, None, False, None
    message = said or info.message
    return {
        "url": info.url if info.probed else None,
        "ready": ready,
        "live": live,
        "restarts": min(info.restarts, 2**31 - 1),
        "last_restart_at": info.last_restart_at,
        "last_exit_code": info.last_exit_code,
        # Ready again since its last crash: no longer crash-looping, even before the journal says so.
        "crash_looping": info.crash_looping and not ever_ready,
        "message": clip_message(message),
    }


def strip_secrets(spec: dict[str, Any]) -> dict[str, Any]:
    """The desired entry to journal: without the container's registry credential (a restart pulls
    nothing: the image is in the node's cache, kept there while the task lives)."""
    out = dict(spec)
    if isinstance(out.get("container"), dict):
        out["container"] = {**out["container"], "auth": None}
    with contextlib.suppress(KeyError):
        del out["started"]
    return out
