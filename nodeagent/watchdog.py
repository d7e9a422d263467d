"""The node's watchdog: stops a node's workloads when their agent is gone, so no job runs twice.

    python -m nodeagent.watchdog --dir STATE_DIR [--dir …] | --root FLEET_STATE_ROOT

A separate process in its own session, started by the agent (or one for a whole simulated fleet), so
it does not die with the agent. The agent renews its lease — it touches ``agent-lease`` in its state
dir — at every turn of its loop. Should the lease go ``fence_after_s`` without renewal (the agent was
SIGKILLed, crashed, or hangs), the watchdog stops every workload the agent's journal lists as live:
SIGTERM to its process group, the task's grace (at most ``max_grace_s``), SIGKILL, and a ``fenced``
marker in the task's directory that tells a returning agent why it ended. An agent restarted within
``fence_after_s`` renews the lease in time and adopts its workloads as before.

The portal starts a job's next attempt only after the node has been silent longer than
fence_after_s + max_grace_s plus a margin (portal/yard_settings.py checks it), so the first attempt's
processes are gone before the second starts. The watchdog exits once it has nothing left to guard.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent import journal as journal_mod
from nodeagent import launcher
from nodeagent.containers.runtime import signal_task

LEASE_FILE = "agent-lease"
PID_FILE = "watchdog.pid"
LOG_FILE = "watchdog.log"
POLL_S = 1.0  # config.WATCHDOG_POLL_S: the agent checks its timeouts against it
# How long it waits with nothing to guard before it exits (the agent starts it again before a launch).
IDLE_EXIT_S = 10.0
log = logging.getLogger("nodeagent.watchdog")


_WRITTEN: dict[Path, str] = {}  # lease file -> the content this process last wrote there


def renew(state_dir: Path, *, fence_after_s: float, max_grace_s: float) -> None:
    """The agent's side: renew the lease (its mtime), with the limits the watchdog applies (its content).

    One utime per turn of the agent's loop; the file is rewritten only when the limits change (a fleet
    runs hundreds of agents in one process, each renewing every tick)."""
    path = state_dir / LEASE_FILE
    content = json.dumps({"fence_after_s": fence_after_s, "max_grace_s": max_grace_s, "agent_pid": os.getpid()})
    if _WRITTEN.get(path) == content:
        try:
            os.utime(path)
            return
        except OSError:
            pass  # removed meanwhile: write it again
    journal_mod.atomic_write(path, content)
    _WRITTEN[path] = content


def _read_pidfile(path: Path) -> tuple[int, int | None] | None:
    try:
        pid_s, _, ticks_s = path.read_text().strip().partition(" ")
        return int(pid_s), int(ticks_s) if ticks_s else None
    except (OSError, ValueError):
        return None


def alive(state_dir: Path) -> int | None:
    """The pid of the watchdog guarding `state_dir`, if one runs."""
    found = _read_pidfile(state_dir / PID_FILE)
    if found is None:
        return None
    pid, ticks = found
    return pid if launcher.process_alive(pid, ticks) else None


class WatchdogHandle:
    """Starts the watchdog for some state dirs (one agent's, or a whole fleet's root) when none runs."""

    def __init__(self, *, dirs: list[Path] | None = None, root: Path | None = None, log_dir: Path) -> None:
        assert (dirs is None) != (root is None)
        self.dirs, self.root, self.log_dir = dirs, root, log_dir
        self.pid: int | None = None

    def _pidfile(self) -> Path:
        return self.log_dir / PID_FILE

    def ensure(self) -> int:
        """Start a watchdog unless one is guarding already; returns its pid."""
        if self.pid is not None and launcher.process_alive(self.pid, None):
            return self.pid
        running = alive(self.log_dir)
        if running is not None:
            self.pid = running
            return running
        args = [sys.executable, "-m", "nodeagent.watchdog"]
        if self.root is not None:
            args += ["--root", str(self.root)]
        for d in self.dirs or []:
            args += ["--dir", str(d)]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / LOG_FILE, "ab") as out:
            child = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, close_fds=True
            )
        self.pid = child.pid
        # Written here as well as by the watchdog, so a second ensure() in the same instant sees it.
        journal_mod.atomic_write(self._pidfile(), f"{child.pid} {launcher.start_ticks(child.pid) or ''}".strip())
        return child.pid


@dataclass
class _Fence:
    pgid: int
    deadline: float
    marker: Path
    note: dict[str, Any] = field(default_factory=dict)
    killed: bool = False
    container: dict[str, Any] | None = None  # the task's container (its processes are not in the group)


@dataclass
class _Dir:
    path: Path
    fenced_for: float | None = None  # the lease mtime this dir was fenced for (once per expiry)
    journal_mtime: float | None = None
    live: list[journal_mod.TaskRecord] = field(default_factory=list)


class Watchdog:
    def __init__(self, *, dirs: list[Path], root: Path | None, clock: Any = time.time) -> None:
        self.fixed, self.root, self.clock = dirs, root, clock
        self.state: dict[Path, _Dir] = {}
        self.fences: list[_Fence] = []
        self.idle_since: float | None = None

    def dirs(self) -> list[Path]:
        found = list(self.fixed)
        if self.root is not None:
            with contextlib.suppress(OSError):
                found += [p for p in self.root.iterdir() if (p / LEASE_FILE).exists()]
        return found

    def _live(self, d: _Dir) -> list[journal_mod.TaskRecord]:
        """The journal's live tasks, re-read only when the journal changed."""
        path = d.path / "journal.json"
        try:
            mtime = path.stat().st_mtime
        except OSError:
            d.live, d.journal_mtime = [], None
            return d.live
        if mtime != d.journal_mtime:
            try:
                d.live = [r for r in journal_mod.load(path).tasks if r.live and r.pid is not None]
                d.journal_mtime = mtime
            except (OSError, ValueError, TypeError, KeyError):
                pass  # being replaced right now: the next poll reads it
        return d.live

    def poll(self) -> bool:
        """One round; False when there is nothing left to guard."""
        now = self.clock()
        guarding = False
        for path in self.dirs():
            d = self.state.setdefault(path, _Dir(path))
            try:
                lease_mtime = (path / LEASE_FILE).stat().st_mtime
                limits = json.loads((path / LEASE_FILE).read_text() or "{}")
            except (OSError, ValueError):
                continue
            fence_after = float(limits.get("fence_after_s", 60.0))
            max_grace = float(limits.get("max_grace_s", 60.0))
            live = [r for r in self._live(d) if r.pid is not None and launcher.process_alive(r.pid, r.start_ticks)]
            guarding = guarding or bool(live)
            if now - lease_mtime > fence_after and d.fenced_for != lease_mtime and live:
                d.fenced_for = lease_mtime
                self._fence(path, live, silent_s=now - lease_mtime, max_grace=max_grace, now=now)
        for fence in list(self.fences):
            if not launcher.group_alive(fence.pgid):
                self.fences.remove(fence)
            elif not fence.killed and now >= fence.deadline:
                signal_task(fence.container, fence.pgid, signal.SIGKILL)
                fence.killed = True
                fence.note["sigkill_at"] = now
                _write_marker(fence.marker, fence.note)
        return guarding or bool(self.fences)

    def _fence(self, path: Path, live: list[journal_mod.TaskRecord], *, silent_s: float, max_grace: float, now: float) -> None:
        log.warning("%s: the agent has not renewed its lease for %.0f s: stopping %d workload(s)", path, silent_s, len(live))
        for record in live:
            assert record.pid is not None
            note = {"reason": f"agent gone: no lease renewal for {silent_s:.0f} s", "sigterm_at": now, "sigkill_at": None}
            # The marker first: a returning agent that sees the process end must know why.
            _write_marker(record.fenced_marker, note)
            signal_task(record.container, record.pid, signal.SIGTERM)
            grace = max(0.0, min(record.grace_s, max_grace))
            deadline = now + grace
            if record.state == "stopping" and record.stop_deadline is not None:
                # The agent had begun this stop (its own liveness, a portal order) and died during the
                # grace: the kill stays due when the agent had it due, not a whole grace later.
                deadline = min(deadline, max(now, record.stop_deadline))
            self.fences.append(
                _Fence(pgid=record.pid, deadline=deadline, marker=record.fenced_marker, note=note, container=record.container)
            )

    def run(self) -> int:
        for path in self.dirs():
            journal_mod.atomic_write(path / PID_FILE, f"{os.getpid()} {launcher.start_ticks(os.getpid()) or ''}".strip())
        while True:
            busy = self.poll()
            now = self.clock()
            if busy:
                self.idle_since = None
            elif self.idle_since is None:
                self.idle_since = now
            elif now - self.idle_since >= IDLE_EXIT_S:
                return 0
            # A timed wait, not time.sleep: libfaketime (the clock-skew test) makes Python's
            # clock_nanosleep fail with EINVAL, and the watchdog must run under any clock.
            _PAUSE.wait(POLL_S)


_PAUSE = threading.Event()  # never set: what the loop waits on between polls


def _write_marker(path: Path, note: dict[str, Any]) -> None:
    try:
        journal_mod.atomic_write(path, json.dumps(note))
    except OSError as exc:
        log.error("cannot write %s: %s", path, exc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nodeagent.watchdog", description="stops workloads whose agent is gone")
    parser.add_argument("--dir", type=Path, action="append", default=[], help="an agent's state dir (repeatable)")
    parser.add_argument("--root", type=Path, help="a fleet's state root: every agent dir under it")
    args = parser.parse_args(argv)
    if not args.dir and args.root is None:
        parser.error("give --dir or --root")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # Not the agent's signals: Ctrl-C in the agent's terminal must not stop the guard of its workloads.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    return Watchdog(dirs=[d.absolute() for d in args.dir], root=args.root.absolute() if args.root else None).run()


if __name__ == "__main__":
    sys.exit(main())
