"""Holding each task to the cores and memory it was given, and measuring what it really uses.

Where the node has cgroup v2 and the agent may write a delegated subtree (its own cgroup, or the
directory YARD_CGROUP_ROOT names), each task gets a child cgroup there: ``cpu.max`` caps it at its
cores' worth of CPU time, ``memory.max`` at its memory (and ``memory.swap.max`` at 0: a task over its
memory is killed by the kernel, not swapped into slowness). Elsewhere (cgroup v1 or a hybrid
hierarchy, a container without delegation) the agent falls back to CPU affinity: the task is pinned
to its number of cores, chosen among those no other live task of this node holds, and its memory is
not limited. The agent says which at its start, once, and never fails a launch because limiting did.

Placement is race-free: the task's wrapper shell is spawned held on its stdin (launcher.spawn), the
agent moves it into its cgroup or pins it while it waits, and only then lets it start the workload,
so every process of the task is born inside its limits.

Real use comes from the task's cgroup where it has one (cpu.stat, memory.current, memory.peak), else
from /proc for the task's whole process tree, in one pass over /proc per heartbeat for all tasks.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_MOUNT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")
ROOT_ENV = "YARD_CGROUP_ROOT"
CPU_PERIOD_US = 100_000
CONTROLLERS = ("cpu", "memory")
# The /proc walk reads at most this many processes per heartbeat, so a fork bomb cannot stall the agent.
PROC_SCAN_LIMIT = 100_000
MIB = 1024 * 1024

TaskKey = tuple[int, int]


@dataclass(frozen=True)
class Limits:
    """What a task was given beside its GPUs; None where the portal sent nothing (an older portal)."""

    cpus: int | None = None
    memory_mb: int | None = None

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Limits:
        return cls(cpus=_positive_int(spec.get("cpus")), memory_mb=_positive_int(spec.get("memory_mb")))

    @property
    def any(self) -> bool:
        return self.cpus is not None or self.memory_mb is not None


def _positive_int(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None


# --------------------------------------------------------------------------- where tasks can get cgroups


def _tokens(path: Path) -> set[str]:
    return {t.lstrip("+") for t in path.read_text().split()}


def own_cgroup(*, mount: Path = CGROUP_MOUNT, self_cgroup: Path = SELF_CGROUP) -> Path | None:
    """This process's cgroup v2 directory (the "0::" line of /proc/self/cgroup), or None."""
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return mount / line[3:].strip().lstrip("/")
    return None


def detect(*, root: Path | None, mount: Path = CGROUP_MOUNT, self_cgroup: Path = SELF_CGROUP) -> tuple[Path | None, str]:
    """(the directory task cgroups go under, "") or (None, why tasks cannot have cgroups here).

    Without ``root``, the base is the agent's own cgroup, as systemd delegates one to a unit with
    ``Delegate=yes``. cgroup v2 lets a cgroup hand controllers to its children only while it holds no
    processes itself, so the agent first moves itself into a leaf ``yard-agent`` beside its tasks.
    """
    if root is None:
        if not (mount / "cgroup.controllers").is_file():
            return None, f"cgroup v2 is not mounted at {mount} (a v1 or hybrid hierarchy)"
        base = own_cgroup(mount=mount, self_cgroup=self_cgroup)
        if base is None:
            return None, f"{self_cgroup} names no cgroup v2 of this agent"
    else:
        base = root
        if not (base / "cgroup.controllers").is_file():
            return None, f"{base} is not a cgroup v2 directory (it has no cgroup.controllers)"
    try:
        missing = [c for c in CONTROLLERS if c not in _tokens(base / "cgroup.controllers")]
        if missing:
            return None, f"the {' and '.join(missing)} controller(s) are not delegated to {base}"
        procs = (base / "cgroup.procs").read_text().split()
        if procs and base != mount:
            if procs != [str(os.getpid())]:
                return None, f"{base} holds other processes ({len(procs)}): give the agent a delegated cgroup of its own"
            leaf = base / "yard-agent"
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
        enabled = _tokens(base / "cgroup.subtree_control")
        if any(c not in enabled for c in CONTROLLERS):
            (base / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
        probe = base / ".yard-probe"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        return None, f"cannot use {base}: {exc.strerror or exc}"
    return base, ""


_DETECTED: dict[tuple[Path | None, Path], tuple[Path | None, str]] = {}
_DETECT_LOCK = threading.Lock()


def detect_once(*, root: Path | None, mount: Path = CGROUP_MOUNT) -> tuple[Path | None, str]:
    """detect(), once per process: a fleet runs many agents in one process, and the first one moved it."""
    with _DETECT_LOCK:
        if (root, mount) not in _DETECTED:
            _DETECTED[(root, mount)] = detect(root=root, mount=mount)
        return _DETECTED[(root, mount)]


# --------------------------------------------------------------------------- limiting


def choose_cores(cores: Sequence[int], taken: Iterable[int], count: int) -> list[int]:
    """`count` of `cores` for a new task: those no live task holds first, then (oversubscribed) the
    least shared ones, wrapping around; in core order."""
    held = Counter(taken)
    ranked = sorted(cores, key=lambda c: (held[c], c))
    return sorted(ranked[:count])


class Limiter:
    """Puts each task's processes in its limits: a cgroup v2 child of `base`, or CPU affinity."""

    def __init__(self, *, base: Path | None, reason: str = "", log: logging.LoggerAdapter[Any] | logging.Logger) -> None:
        self.base = base
        self.reason = reason  # why tasks get no cgroups (empty when they do)
        self.log = log
        self.cores = sorted(os.sched_getaffinity(0))
        self.groups: dict[TaskKey, Path] = {}
        self.leftovers: dict[TaskKey, Path] = {}  # cgroups that still held processes when their task ended

    @classmethod
    def for_node(cls, *, log: logging.LoggerAdapter[Any] | logging.Logger) -> Limiter:
        raw = os.environ.get(ROOT_ENV)
        base, reason = detect_once(root=Path(raw) if raw else None)
        limiter = cls(base=base, reason=reason, log=log)
        if base is None:
            log.warning("%s: CPU limited by affinity only, memory not limited", reason)
        else:
            log.info("task limits: cgroup v2 under %s (cpu.max, memory.max)", base)
        return limiter

    @property
    def mode(self) -> str:
        """How this node holds tasks to their limits: "cgroup" (cores and memory) or "affinity" (cores only)."""
        return "cgroup" if self.base is not None else "affinity"

    def cgroup_path(self, key: TaskKey) -> Path | None:
        return None if self.base is None else self.base / f"yard-task-{key[0]}-{key[1]}"

    def group_of(self, key: TaskKey) -> Path | None:
        """The task's cgroup, also for a task a previous agent started (the name is the task's)."""
        if key not in self.groups and (path := self.cgroup_path(key)) is not None and path.is_dir():
            self.groups[key] = path
        return self.groups.get(key)

    def apply(self, key: TaskKey, pid: int, limits: Limits, *, others: Iterable[int]) -> str:
        """Hold `pid` (the task's wrapper, still waiting to start the workload) to `limits`. Returns how
        ("cgroup /sys/fs/cgroup/…", "cores 0-3", "unlimited"); never raises: an unlimited task beats
        a failed one. `others` are the pids of this node's other live tasks (for their cores)."""
        if not limits.any:
            return "unlimited"
        if (path := self.cgroup_path(key)) is not None:
            try:
                self._into_cgroup(path, pid, limits)
                self.groups[key] = path
                return f"cgroup {path}"
            except OSError as exc:
                self.log.error("task %s attempt %s: cannot limit it in cgroup %s (%s): trying CPU affinity", *key, path, exc)
                with contextlib.suppress(OSError):
                    path.rmdir()
        if limits.cpus is None or limits.cpus >= len(self.cores):
            return "unlimited"
        cores = choose_cores(self.cores, self._taken(others), limits.cpus)
        try:
            os.sched_setaffinity(pid, cores)
        except OSError as exc:
            self.log.error("task %s attempt %s: cannot pin it to cores %s (%s): it runs unlimited", *key, cores, exc)
            return "unlimited"
        return f"cores {','.join(map(str, cores))}"

    def _into_cgroup(self, path: Path, pid: int, limits: Limits) -> None:
        path.mkdir(exist_ok=True)
        if limits.cpus is not None:
            (path / "cpu.max").write_text(f"{limits.cpus * CPU_PERIOD_US} {CPU_PERIOD_US}")
        if limits.memory_mb is not None:
            (path / "memory.max").write_text(str(limits.memory_mb * MIB))
            swap = path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")
        (path / "cgroup.procs").write_text(str(pid))

    def _taken(self, pids: Iterable[int]) -> list[int]:
        """The cores other live tasks are pinned to (read from the OS: it holds after an agent restart)."""
        everything = set(self.cores)
        taken: list[int] = []
        for pid in pids:
            try:
                cores = os.sched_getaffinity(pid)
            except OSError:
                continue
            if not everything <= cores:
                taken.extend(cores)
        return taken

    def release(self, key: TaskKey) -> str | None:
        """Remove the ended task's cgroup, killing whatever of it escaped its process group. Returns a
        line for the task's log when the kernel killed it for going over its memory, else None."""
        path = self.group_of(key)
        self.groups.pop(key, None)
        if path is None:
            return None
        note = None
        with contextlib.suppress(OSError, ValueError):
            events = dict(line.split() for line in (path / "memory.events").read_text().splitlines())
            if int(events.get("oom_kill", 0)) > 0:
                limit = (path / "memory.max").read_text().strip()
                size = f"{int(limit) // MIB} MiB" if limit.isdigit() else limit
                note = f"yard-agent: the task went over its memory limit ({size}) and the kernel killed it (out of memory)"
        self._kill_members(path)
        if not self._remove(path):
            self.leftovers[key] = path
        return note

    def sweep(self) -> None:
        """Retry removing cgroups whose last processes were still exiting when their task ended."""
        for key, path in list(self.leftovers.items()):
            if self._remove(path):
                del self.leftovers[key]

    def _kill_members(self, path: Path) -> None:
        kill = path / "cgroup.kill"  # Linux 5.14+
        if kill.exists():
            with contextlib.suppress(OSError):
                kill.write_text("1")
            return
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return
        relative = "/" + str(path.relative_to(CGROUP_MOUNT)) if path.is_relative_to(CGROUP_MOUNT) else None
        for pid in pids:
            # Only a process the kernel says is in this cgroup: never a pid read from a stale file.
            try:
                member = relative is not None and f"0::{relative}\n" in Path(f"/proc/{pid}/cgroup").read_text()
            except OSError:
                continue
            if member:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    def _remove(self, path: Path) -> bool:
        try:
            path.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                return False  # EBUSY: processes still in it
            # A cgroup's files go with its directory; a plain directory (a base that is not cgroupfs)
            # must be emptied first.
            for child in path.iterdir():
                with contextlib.suppress(OSError):
                    child.unlink()
            try:
                path.rmdir()
            except OSError:
                return False
        return True


# --------------------------------------------------------------------------- real use


@dataclass(frozen=True)
class TaskUse:
    cpu_used: float | None = None  # cores busy over the interval since the previous reading
    memory_used_mb: float | None = None  # resident now
    memory_peak_mb: float | None = None  # the most resident memory seen


@dataclass(frozen=True)
class _Proc:
    ppid: int
    session: int
    cpu_ticks: int  # user + system time of the process and of its reaped children
    rss_pages: int


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cgroup_usec(path: Path) -> int | None:
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def scan_proc(limit: int = PROC_SCAN_LIMIT) -> dict[int, _Proc]:
    """Every process's parent, session, CPU time and resident pages, in one bounded pass over /proc."""
    procs: dict[int, _Proc] = {}
    try:
        entries = os.scandir("/proc")
    except OSError:
        return procs
    with entries:
        for entry in entries:
            if not entry.name.isdigit():
                continue
            if len(procs) >= limit:
                break
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as handle:
                    raw = handle.read()
            except OSError:
                continue
            fields = raw[raw.rfind(b")") + 2 :].split()
            if len(fields) < 22 or fields[0] in (b"Z", b"X"):
                continue
            ticks = int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])
            procs[int(entry.name)] = _Proc(
                ppid=int(fields[1]), session=int(fields[3]), cpu_ticks=ticks, rss_pages=int(fields[21])
            )
    return procs


@dataclass
class _Pass:
    """One pass over /proc, with the maps the process trees are read from."""

    at: float  # when it was taken (the meter's clock)
    procs: dict[int, _Proc]
    children: dict[int, list[int]]
    sessions: dict[int, list[int]]


def _take_pass(clock: Callable[[], float]) -> _Pass:
    procs = scan_proc()
    children: dict[int, list[int]] = {}
    sessions: dict[int, list[int]] = {}
    for child, p in procs.items():
        children.setdefault(p.ppid, []).append(child)
        sessions.setdefault(p.session, []).append(child)
    return _Pass(clock(), procs, children, sessions)


class SharedProcPasses:
    """A pass over /proc shared by every agent of one process: `nodeagent.fleet` runs hundreds of
    simulated nodes on one host, whose /proc holds all their workloads, and a pass each per heartbeat
    (500 agents x 8,000 processes) took most of the fleet's CPU in a 4,000-job fill, starving its
    agents' heartbeats. A pass younger than ``max_age_s`` serves them all; its time is the reading's."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_age_s, self.clock = max_age_s, clock
        self.lock = threading.Lock()
        self.last: _Pass | None = None

    def get(self) -> _Pass:
        with self.lock:
            if self.last is None or self.clock() - self.last.at > self.max_age_s:
                self.last = _take_pass(self.clock)
            return self.last


# Set by nodeagent.fleet (share_proc_passes); an agent alone on its node takes a fresh pass per heartbeat.
_shared_passes: SharedProcPasses | None = None


def share_proc_passes(max_age_s: float) -> None:
    """Let every UseMeter of this process share passes over /proc up to ``max_age_s`` old."""
    global _shared_passes
    _shared_passes = SharedProcPasses(max_age_s)


def process_tree(root: int, procs: dict[int, _Proc], children: dict[int, list[int]], sessions: dict[int, list[int]]) -> set[int]:
    """`root`, its descendants, and what was reparented away but stayed in its session (tasks run as
    session leaders: launcher.spawn)."""
    seen = {root} if root in procs else set()
    seen.update(sessions.get(root, ()))
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


class UseMeter:
    """Each task's real CPU and memory use, reading by reading (one reading per heartbeat)."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.previous: dict[TaskKey, tuple[float, float]] = {}  # (when, CPU seconds so far)
        self.peaks: dict[TaskKey, float] = {}
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")
        self.page_mb = os.sysconf("SC_PAGE_SIZE") / MIB

    def measure(self, tasks: Sequence[tuple[TaskKey, int, Path | None]]) -> dict[TaskKey, TaskUse]:
        """(key, process-group leader pid, cgroup or None) of each live task -> its use. CPU needs two
        readings: the first reading of a task has none."""
        now = self.clock()
        scan: _Pass | None = None
        out: dict[TaskKey, TaskUse] = {}
        for key, pid, group in tasks:
            cpu_s: float | None = None
            rss_mb: float | None = None
            peak_mb: float | None = None
            if group is not None:
                usec = _cgroup_usec(group)
                cpu_s = None if usec is None else usec / 1e6
                current = _read_int(group / "memory.current")
                rss_mb = None if current is None else current / MIB
                peak = _read_int(group / "memory.peak")  # Linux 5.19+
                peak_mb = None if peak is None else peak / MIB
            when = now
            if cpu_s is None or rss_mb is None:
                if scan is None:
                    shared = _shared_passes
                    scan = shared.get() if shared is not None and self.clock is shared.clock else _take_pass(self.clock)
                tree = [scan.procs[p] for p in process_tree(pid, scan.procs, scan.children, scan.sessions)]
                if cpu_s is None and tree:
                    cpu_s = sum(p.cpu_ticks for p in tree) * self.tick_s
                    when = scan.at  # the CPU time read then
                if rss_mb is None and tree:
                    rss_mb = sum(p.rss_pages for p in tree) * self.page_mb
            out[key] = self._fold(key, when, cpu_s, rss_mb, peak_mb)
        for key in set(self.previous) - set(out):
            self.previous.pop(key, None)
            self.peaks.pop(key, None)
        return out

    def _fold(self, key: TaskKey, now: float, cpu_s: float | None, rss_mb: float | None, peak_mb: float | None) -> TaskUse:
        cores: float | None = None
        before = self.previous.get(key)
        if cpu_s is not None:
            if before is not None and now > before[0]:
                # A process that left the tree takes its time with it: never report less than nothing.
                cores = max(0.0, (cpu_s - before[1]) / (now - before[0]))
            self.previous[key] = (now, cpu_s)
        if rss_mb is not None:
            peak_mb = max(peak_mb or 0.0, self.peaks.get(key, 0.0), rss_mb)
        if peak_mb is not None:
            self.peaks[key] = peak_mb
        return TaskUse(
            cpu_used=None if cores is None else round(cores, 3),
            memory_used_mb=None if rss_mb is None else round(rss_mb, 1),
            memory_peak_mb=None if peak_mb is None else round(peak_mb, 1),
        )
