"""The agent's configuration and every default in one place.

The timeouts must fit together with the portal's node liveness (see docs/agent-api.md): stale work on
a node that lost the portal must be gone before the portal declares the node DOWN and requeues it::

    stop_after_s + MAX_GRACE_S + fence_grace_s + heartbeat_interval_s  <  NODE_DOWN_AFTER_S
    120          + 60          + 5             + 10                    =  195  <  300

and with the node's watchdog, which fences once the agent's lease has not been renewed for
fence_after_s: the agent renews it at every turn of its loop and before every call to the portal, so
the longest a live agent leaves it is one call (at most http_timeout_s) and one turn, and a slow portal
must never look like a dead agent (check_timeouts)::

    http_timeout_s + heartbeat_interval_s  <  fence_after_s
    20             + 10                    =  30  <  60
"""

from __future__ import annotations

import os
import shutil
import socket
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

HEARTBEAT_INTERVAL_S = 10.0
# Agent-side liveness: stop the workloads after this long without reaching the portal.
STOP_AFTER_S = 120.0
# The portal's timeout before a silent node is DOWN; the agent only checks the relation above.
NODE_DOWN_AFTER_S = 300.0
# The most grace the agent gives when it stops work on its own because it lost the portal (the
# relation above); a stop the portal orders gets the grace it asks for, up to MAX_ORDERED_GRACE_S.
MAX_GRACE_S = 60.0
MAX_ORDERED_GRACE_S = 3600.0
DEFAULT_GRACE_S = 60.0
# Fencing is for work the portal no longer wants at all: a short grace, no checkpoint expected.
FENCE_GRACE_S = 5.0
# A workload whose agent is gone (killed, hung) is stopped by the node's watchdog once the agent has not
# renewed its lease for this long (the portal sends its own value); an agent back sooner adopts it.
FENCE_AFTER_S = 60.0
WINDOW_S = 60.0
# A process group that outlives SIGKILL this long is stuck (D state, a hung driver): drain the node.
UNKILLABLE_AFTER_S = 60.0
# Long enough that a call queued behind a loaded web tier is still there for the portal's answer (an
# "overloaded" one counts as contact, a timeout does not: docs/scale.md, *The fence under overload*).
HTTP_TIMEOUT_S = 20.0
# How often the watchdog looks at the lease (nodeagent/watchdog.py, POLL_S).
WATCHDOG_POLL_S = 1.0
# Under a portal's short fence_after_s the agent shortens its HTTP timeout to fit (fit_http_timeout),
# but not below this: a portal that leaves no more room than this is misconfigured.
MIN_HTTP_TIMEOUT_S = 0.5
BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 30.0
# The supervision tick: how quickly exits, stops and log lines are noticed.
TICK_S = 0.5
LOG_CHUNK_BYTES = 64 * 1024
# Logs go out in batches: one request per task every few seconds, not one per line.
LOG_SHIP_INTERVAL_S = 2.0
LOG_CHUNKS_PER_ROUND = 16
# XID codes kept for the next heartbeat while the portal is unreachable, per GPU.
MAX_PENDING_XIDS = 100
DEFAULT_STATE_DIR = "/var/lib/yard-agent"
# What a simulated node registers per (physical) GPU unless told otherwise: an 8-GPU HGX server has
# about 112 cores and 2 TiB of memory.
SIM_CPUS_PER_GPU = 14
SIM_MEMORY_MB_PER_GPU = 256 * 1024

assert STOP_AFTER_S + MAX_GRACE_S + FENCE_GRACE_S + HEARTBEAT_INTERVAL_S < NODE_DOWN_AFTER_S
assert HTTP_TIMEOUT_S + HEARTBEAT_INTERVAL_S < FENCE_AFTER_S
assert STOP_AFTER_S + 2 * HTTP_TIMEOUT_S + TICK_S + FENCE_AFTER_S + MAX_GRACE_S + 2 * WATCHDOG_POLL_S < NODE_DOWN_AFTER_S


class ConfigError(Exception):
    """A configuration value is missing or wrong; the message says which."""


def default_address() -> str:
    """The address other nodes reach this one on: the host name's IP, else loopback."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


@dataclass(frozen=True)
class AgentConfig:
    portal: str
    token: str
    name: str = field(default_factory=socket.gethostname)
    address: str = field(default_factory=default_address)
    leaf: str = "leaf-0"
    spine: str = "spine-0"
    # The multi-node NVLink domain (a GB200 NVL72 rack) the node is in, registered with it; "" (the default):
    # NVML's GPU fabric info says (nodeagent/telemetry.py), or none.
    fabric_domain: str = ""
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S
    stop_after_s: float = STOP_AFTER_S
    fence_grace_s: float = FENCE_GRACE_S
    fence_after_s: float = FENCE_AFTER_S
    max_grace_s: float = MAX_GRACE_S
    # GPU telemetry is folded into windows of this many seconds (the portal's YARD_TELEMETRY_WINDOW_S).
    window_s: float = WINDOW_S
    unkillable_after_s: float = UNKILLABLE_AFTER_S
    http_timeout_s: float = HTTP_TIMEOUT_S
    tick_s: float = TICK_S
    # "8xH100" for simulated GPUs; None means real GPUs through NVML.
    simulate: str | None = None
    topology_file: Path | None = None
    # Simulated nodes only: the cores and memory (MiB) to register (None: SIM_*_PER_GPU × GPUs), and a
    # MIG layout such as "0:1g.10gb*7,1:3g.40gb*2" (nodeagent/simgpu.py).
    sim_cpus: int | None = None
    sim_memory_mb: int | None = None
    sim_mig: str | None = None
    # Run each task as the local account named like its owner in the portal (as Slurm runs a job as
    # its user); needs root. Off: tasks run as the agent's user (a simulated cluster, a single user).
    run_as_owner: bool = False
    # Containers (docs/containers.md): the runtime ("auto": runc when found and root; "runc"; "none"),
    # the image cache (None: <state_dir>/images) and its size, the registries images may come from
    # (comma-separated host[:port]; empty: any) and those reached over plain HTTP besides loopback.
    container_runtime: str = "auto"
    image_cache: Path | None = None
    image_cache_gb: float = 50.0
    registry_allow: str = ""
    registry_insecure: str = ""

    def __post_init__(self) -> None:
        # Workloads run in their own working directories: every path the agent hands them (exit-status
        # file, YARD_SIM_UTIL_FILE, logs) must not depend on the agent's current directory.
        object.__setattr__(self, "state_dir", self.state_dir.absolute())

    @property
    def simulated(self) -> bool:
        return self.simulate is not None or self.topology_file is not None


_TOML_KEYS = {f.name for f in fields(AgentConfig)} - {"portal", "token"}
_FLOAT_KEYS = {
    "heartbeat_interval_s",
    "stop_after_s",
    "fence_grace_s",
    "fence_after_s",
    "max_grace_s",
    "unkillable_after_s",
    "http_timeout_s",
    "tick_s",
    "image_cache_gb",
}
_PATH_KEYS = {"state_dir", "topology_file", "image_cache"}
_BOOL_KEYS = {"run_as_owner"}
_INT_KEYS = {"sim_cpus", "sim_memory_mb"}
_SIM_ONLY = ("sim_cpus", "sim_memory_mb", "sim_mig")


def load_toml(path: Path) -> dict[str, Any]:
    """Read a TOML config file into AgentConfig keyword arguments, failing loudly on unknown keys."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    unknown = set(raw) - _TOML_KEYS - {"portal", "token"}
    if unknown:
        raise ConfigError(f"unknown key(s) in {path}: {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _FLOAT_KEYS:
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{path}: {key} must be a positive number, not {value!r}")
            values[key] = float(value)
        elif key in _PATH_KEYS:
            values[key] = Path(str(value))
        elif key in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise ConfigError(f"{path}: {key} must be true or false, not {value!r}")
            values[key] = value
        elif key in _INT_KEYS:
            if type(value) is not int or value <= 0:
                raise ConfigError(f"{path}: {key} must be a positive integer, not {value!r}")
            values[key] = value
        elif not isinstance(value, str):
            raise ConfigError(f"{path}: {key} must be a string, not {value!r}")
        else:
            values[key] = value
    return values


def build_config(*, file_values: dict[str, Any], cli_values: dict[str, Any]) -> AgentConfig:
    """Merge file and command-line values (the command line wins) and check what must be there."""
    merged = {**file_values, **{k: v for k, v in cli_values.items() if v is not None}}
    for required in ("portal", "token"):
        if not merged.get(required):
            raise ConfigError(f"--{required} is required (on the command line or in the config file)")
    config = AgentConfig(**merged)
    for key in _SIM_ONLY:
        if getattr(config, key) is not None and not config.simulated:
            # A real node registers what it has; a made-up number there would mislead the scheduler.
            raise ConfigError(f"--{key.replace('_', '-')} is for simulated nodes only (with --simulate or --topology)")
    for key in _INT_KEYS:
        value = getattr(config, key)
        if value is not None and (type(value) is not int or value <= 0):
            raise ConfigError(f"--{key.replace('_', '-')} must be a positive integer, not {value!r}")
    if config.container_runtime not in ("auto", "runc", "none"):
        raise ConfigError(f"--container-runtime must be auto, runc or none, not {config.container_runtime!r}")
    if config.image_cache_gb <= 0:
        raise ConfigError(f"--image-cache-gb must be a positive number, not {config.image_cache_gb!r}")
    if config.run_as_owner:
        if os.geteuid() != 0:
            raise ConfigError("--run-as-owner needs the agent to run as root: it switches to each task owner's account")
        if shutil.which("setpriv") is None:
            raise ConfigError("--run-as-owner needs setpriv (util-linux) on the node")
    if config.stop_after_s + MAX_GRACE_S + config.fence_grace_s + config.heartbeat_interval_s >= NODE_DOWN_AFTER_S:
        raise ConfigError(
            f"stop_after_s={config.stop_after_s} is too long: stale work would outlive the portal's "
            f"{NODE_DOWN_AFTER_S:.0f} s DOWN timeout (see nodeagent/config.py)"
        )
    # An agent that dies (or hangs) just before its own stop leaves its work to the watchdog, which
    # fences fence_after_s after the last lease renewal: docs/scale.md, *The fence under overload*.
    bound = late_loss_bound_s(config)
    if bound >= NODE_DOWN_AFTER_S:
        raise ConfigError(
            f"stop_after_s + fence_after_s + max_grace_s + 2 x http_timeout_s + tick_s + 2 watchdog polls = {bound:g} s "
            f"is too long: an agent lost just before its own stop leaves its work running that long, past the portal's "
            f"{NODE_DOWN_AFTER_S:.0f} s DOWN timeout; shorten --stop-after or --fence-after (see docs/scale.md)"
        )
    problem = check_timeouts(config)
    if problem is not None:
        raise ConfigError(problem)
    return config


def late_loss_bound_s(config: AgentConfig) -> float:
    """The most observed silence a node's work can outlive when its agent dies just before its own
    stop (docs/scale.md, *The fence under overload*): the agent's silence may reach stop_after_s plus a
    turn of its loop, the portal's exceeds it by at most one call, then the watchdog fences."""
    turn = config.http_timeout_s + config.tick_s
    return config.stop_after_s + turn + config.http_timeout_s + config.fence_after_s + config.max_grace_s + 2 * WATCHDOG_POLL_S


def check_timeouts(config: AgentConfig) -> str | None:
    """Why this HTTP timeout, heartbeat interval and fence do not fit together (None: they do).

    One call that takes the whole HTTP timeout must not let the watchdog fence a live agent's work."""
    if config.http_timeout_s + config.heartbeat_interval_s < config.fence_after_s:
        return None
    return (
        f"fence_after_s={config.fence_after_s:g} must be longer than http_timeout_s={config.http_timeout_s:g} + "
        f"heartbeat_interval_s={config.heartbeat_interval_s:g}: one slow answer from the portal would let the "
        f"watchdog stop the workloads of a live agent; raise --fence-after (fence_after_s) or shorten "
        f"--http-timeout (http_timeout_s) or --heartbeat-interval (heartbeat_interval_s)"
    )


def fit_http_timeout(config: AgentConfig) -> AgentConfig:
    """Shorten the HTTP timeout to fit the fence (check_timeouts), as the portal's limits may require:
    the agent must adopt the portal's fence_after_s (its requeue arithmetic rests on it), and a shorter
    timeout only makes a slow call fail sooner. Not below MIN_HTTP_TIMEOUT_S."""
    if check_timeouts(config) is None:
        return config
    fitted = 0.8 * (config.fence_after_s - config.heartbeat_interval_s)
    return replace(config, http_timeout_s=fitted) if fitted >= MIN_HTTP_TIMEOUT_S else config


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value > 0 else None


def with_portal_limits(
    config: AgentConfig,
    *,
    heartbeat_interval_s: Any = None,
    stop_after_s: Any = None,
    fence_after_s: Any = None,
    max_grace_s: Any = None,
    window_s: Any = None,
) -> AgentConfig:
    """Adopt the portal's heartbeat interval, and the stricter of each limit the liveness arithmetic
    rests on: the portal checks that its DOWN timeout covers its own values (portal/yard_settings.py)."""
    updated = config
    if (value := _number(heartbeat_interval_s)) is not None:
        updated = replace(updated, heartbeat_interval_s=value)
    if (value := _number(stop_after_s)) is not None and value < updated.stop_after_s:
        updated = replace(updated, stop_after_s=value)
    if (value := _number(fence_after_s)) is not None and value < updated.fence_after_s:
        updated = replace(updated, fence_after_s=value)
    if isinstance(max_grace_s, int | float) and not isinstance(max_grace_s, bool) and 0 <= max_grace_s < updated.max_grace_s:
        updated = replace(updated, max_grace_s=float(max_grace_s))
    if (value := _number(window_s)) is not None:
        updated = replace(updated, window_s=value)  # the portal's grain, as given: its windows must line up
    return fit_http_timeout(updated)
