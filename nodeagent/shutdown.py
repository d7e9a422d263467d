"""Stopping every workload of one or more agents, for a demo or test host that is shutting down.

On a GPU node an agent's workloads outlive the agent by design (a restarted agent adopts them), so an
Agent never stops them on its own exit. A simulated fleet on a laptop (`make run`) is the other case:
when the demo stops, what it started must stop too, JupyterLab servers and their kernels included.

A workload is its process group (the launcher starts each in a new session) plus every descendant of
its leader, wherever it went: Jupyter starts its kernels in sessions of their own, so signalling the
group alone would leave the kernels behind. All workloads get SIGTERM at once, then a short grace,
then SIGKILL, so N agents cost one grace, not N.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from nodeagent import launcher
from nodeagent.agent import Agent

log = logging.getLogger("nodeagent.shutdown")


def workload_leaders(agent: Agent) -> list[int]:
    """Process-group leaders of the agent's live workloads (those it started or adopted)."""
    leaders: list[int] = []
    for record in agent.records.values():
        if record.live and record.pid is not None and launcher.process_alive(record.pid, record.start_ticks):
            leaders.append(record.pid)
    return leaders


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, pgid, state) of every process now."""
    table: dict[int, tuple[int, int, str]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), int(fields[2]), fields[0])
    return table


def workload_processes(leaders: Iterable[int]) -> set[int]:
    """Live (non-zombie) processes in the leaders' groups, and every descendant of those."""
    table = _processes()
    groups = set(leaders)
    found = {pid for pid, (_, pgid, state) in table.items() if pgid in groups and state not in ("Z", "X")}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    stack = list(found | groups)
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found and table[child][2] not in ("Z", "X"):
                found.add(child)
                stack.append(child)
    return found


def _signal_all(groups: Iterable[int], pids: dict[int, int | None], signum: signal.Signals) -> None:
    for pgid in groups:
        launcher.signal_group(pgid, signum)
    for pid, ticks in pids.items():
        # The start time guards against a pid the kernel has handed to an unrelated process since.
        if launcher.process_alive(pid, ticks):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)


def _alive(leaders: list[int], seen: dict[int, int | None]) -> dict[int, int | None]:
    """Live workload processes now: those in the groups or under the leaders, and those seen before."""
    now = {pid: seen.get(pid, launcher.start_ticks(pid)) for pid in workload_processes(leaders)}
    now.update({pid: ticks for pid, ticks in seen.items() if launcher.process_alive(pid, ticks)})
    return now


def stop_workloads(agents: Iterable[Agent], *, grace_s: float = 3.0, kill_wait_s: float = 2.0) -> int:
    """SIGTERM every workload of `agents`, SIGKILL what remains after `grace_s`; returns how many
    processes were found. Call it once the agents' loops have stopped, so that none starts anew."""
    leaders = [pid for agent in agents for pid in workload_leaders(agent)]
    if not leaders:
        return 0
    seen = _alive(leaders, {})
    log.info("stopping %d workload(s) (%d processes): SIGTERM, %.0f s grace, then SIGKILL", len(leaders), len(seen), grace_s)
    _signal_all(leaders, seen, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = seen
    while time.monotonic() < deadline:
        # Anything a workload forks while it stops (a checkpoint writer) is one of its processes too.
        alive = _alive(leaders, seen)
        seen = {**seen, **alive}
        if not alive:
            return len(seen)
        time.sleep(0.1)
    alive = _alive(leaders, seen)
    if alive:
        log.warning("%d workload process(es) outlived the grace: SIGKILL", len(alive))
        _signal_all(leaders, alive, signal.SIGKILL)
    deadline = time.monotonic() + kill_wait_s
    while time.monotonic() < deadline and _alive(leaders, alive):
        time.sleep(0.05)
    return len({**seen, **alive})
