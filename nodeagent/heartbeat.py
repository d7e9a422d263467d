"""Heartbeats: what the agent tells the portal every few seconds, and its telemetry.

A heartbeat carries the node's complete local view of its tasks (with each start time, so the portal
records starts in bulk), and telemetry only when there is some to send: GPU utilisation is sampled
every heartbeat interval and folded here, on the node, into one-minute windows (samples, sum and
maximum of utilisation, maximum memory), sent once each minute is over, with the latest reading of
each GPU beside it (sooner when a GPU's utilisation moved by 10 points). XID errors go out at once.
So the portal writes a node's telemetry about once a minute, not at every heartbeat, and the idle
reaper reads exactly the windows the agents folded.

Windows and XIDs not yet acknowledged are kept (capped) while the portal is unreachable, and dropped
if the portal refuses them, so a value it will not take can never make every later heartbeat fail.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeagent import notebook, protocol
from nodeagent.cgroups import TaskUse
from nodeagent.client import PortalError
from nodeagent.context import Node, TaskKey
from nodeagent.journal import TaskRecord
from nodeagent.topology import GpuSample, GpuSource

# Bounds the walk for the newest checkpoint file, so a huge checkpoint tree cannot stall heartbeats.
CHECKPOINT_SCAN_LIMIT = 10_000
CHECKPOINT_RESCAN_S = 15.0


def newest_mtime(root: Path) -> float | None:
    """mtime of the newest file under `root` (the task's last checkpoint), or None if there is none."""
    import os

    newest: float | None = None
    seen = 0
    stack = [root]
    while stack and seen < CHECKPOINT_SCAN_LIMIT:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            seen += 1
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
                elif entry.is_file(follow_symlinks=False):
                    mtime = entry.stat(follow_symlinks=False).st_mtime
                    newest = mtime if newest is None else max(newest, mtime)
            except OSError:
                continue
    return newest


@dataclass
class _Window:
    start: float
    samples: int = 0
    utilization_sum: float = 0.0
    utilization_max: float = 0.0
    memory_used_max_mb: float = 0.0

    def to_json(self, index: int) -> dict[str, Any]:
        return {
            "index": index,
            "start": self.start,
            "samples": self.samples,
            "utilization_sum": round(self.utilization_sum, 3),
            "utilization_max": self.utilization_max,
            "memory_used_max_mb": self.memory_used_max_mb,
        }


UTIL_NEWS_PCT = 10.0


def _moved(before: float | None, now: float | None) -> bool:
    if before is None or now is None:
        return before is not now
    return abs(now - before) >= UTIL_NEWS_PCT


class Telemetry:
    """GPU readings folded into minute windows, and the XIDs seen, until the portal has them."""

    def __init__(self, gpus: GpuSource, *, where: str) -> None:
        self.source = gpus
        self.where = where
        self.latest: list[GpuSample] = []
        self.open: dict[int, _Window] = {}
        self.done: list[dict[str, Any]] = []  # closed windows not yet acknowledged
        self.xids: dict[int, list[int]] = {}
        self.latest_due = True  # send the latest readings (first heartbeat, then with each closed minute)
        self.sent: dict[int, float | None] = {}  # utilisation last sent, per GPU
        self.next_sample = 0.0

    def sample(self, now: float, util_files: dict[int, Path], *, window_s: float = 60.0) -> None:
        """One reading of every GPU, folded into the window it falls in (windows are aligned to the epoch)."""
        minute = math.floor(now / window_s) * window_s
        cleaned: list[GpuSample] = []
        for s in self.source.sample(util_files):
            where = f"{self.where} GPU {s.index}"
            util = protocol.clean_metric("utilization_pct", s.utilization_pct, where=where)
            memory = protocol.clean_metric("memory_used_mb", s.memory_used_mb, where=where)
            sample = GpuSample(
                uuid=s.uuid,
                index=s.index,
                utilization_pct=util,
                memory_used_mb=None if memory is None else int(memory),
                temperature_c=protocol.clean_metric("temperature_c", s.temperature_c, where=where),
                power_w=protocol.clean_metric("power_w", s.power_w, where=where),
            )
            cleaned.append(sample)
            if s.xid_errors:
                pending = self.xids.setdefault(s.index, [])
                pending.extend(protocol.clean_xids(list(s.xid_errors), where=where))
                del pending[: -protocol.MAX_XIDS_PER_GPU]
            window = self.open.get(s.index)
            if window is not None and window.start != minute:
                if window.samples:
                    self.done.append(window.to_json(s.index))
                    self.latest_due = True
                window = None
            if window is None:
                window = self.open[s.index] = _Window(start=minute)
            if util is not None:
                window.samples += 1
                window.utilization_sum += util
                window.utilization_max = max(window.utilization_max, util)
            if memory is not None:
                window.memory_used_max_mb = max(window.memory_used_max_mb, memory)
        del self.done[: -protocol.MAX_WINDOWS]
        self.latest = cleaned
        # A GPU that went busy or idle is news the portal's pages should not wait a minute for.
        if any(_moved(self.sent.get(s.index), s.utilization_pct) for s in cleaned):
            self.latest_due = True

    def outgoing(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[int, int], int]:
        """(gpus, windows, xids sent per GPU, windows sent) for the next heartbeat."""
        sent_xids = {index: len(codes) for index, codes in self.xids.items() if codes}
        gpus: list[dict[str, Any]] = []
        if self.latest_due or sent_xids:
            gpus = [{**s.to_json(), "xid_errors": list(self.xids.get(s.index, []))} for s in self.latest]
        return gpus, list(self.done), sent_xids, len(self.done)

    def acknowledged(self, *, sent_xids: dict[int, int], windows: int, latest: bool) -> None:
        for index, count in sent_xids.items():
            del self.xids[index][:count]
        del self.done[:windows]
        if latest:
            self.latest_due = False
            self.sent = {s.index: s.utilization_pct for s in self.latest}

    def refused(self) -> None:
        """The portal refused a heartbeat (400): drop what it may have refused, so the next one goes through."""
        self.xids.clear()
        self.done.clear()


class Heartbeats:
    """Builds each heartbeat, sends it when due, and hands the portal's answer on: its limits to
    `adopt_limits`, its `desired` list to `reconcile` (both the agent's). Into the heartbeat go the
    Stopper's `draining_reason`, the Workloads' `measure_use` (each live task's CPU and memory use),
    their `service_report` (a service replica's probes and restarts; None for other tasks) and their
    `dev_report` (a dev session's sshd; None for other tasks)."""

    def __init__(
        self,
        node: Node,
        *,
        draining_reason: Callable[[], str | None],
        measure_use: Callable[[], Mapping[TaskKey, TaskUse]],
        adopt_limits: Callable[[dict[str, Any]], None],
        reconcile: Callable[[list[dict[str, Any]]], None],
        service_report: Callable[[TaskRecord], dict[str, Any] | None] = lambda record: None,
        dev_report: Callable[[TaskRecord], dict[str, Any] | None] = lambda record: None,
    ) -> None:
        self.node = node
        self.draining_reason = draining_reason
        self.measure_use = measure_use
        self.adopt_limits = adopt_limits
        self.reconcile = reconcile
        self.service_report = service_report
        self.dev_report = dev_report
        self.telemetry = Telemetry(node.gpus, where=node.config.name)
        self.next_heartbeat = 0.0
        self.node_state: str | None = None  # as the portal last said
        self.checkpoints: dict[TaskKey, tuple[float, float | None]] = {}
        self.notebook_probes: dict[TaskKey, notebook.ProbeMemory] = {}

    def soon(self, delay_s: float = 1.0) -> None:
        """Send the next heartbeat within `delay_s` (something changed the portal should hear of)."""
        self.next_heartbeat = min(self.next_heartbeat, self.node.clock() + delay_s)

    def _util_files(self) -> dict[int, Path]:
        files: dict[int, Path] = {}
        for record in self.node.records.values():
            if record.live:
                files.update({index: record.util_file for index in record.gpus})
        return files

    def sample_if_due(self, now: float) -> None:
        """GPU readings keep their cadence whether or not the portal answers."""
        if now >= self.telemetry.next_sample:
            # At least a few samples per window, however long the heartbeat interval.
            config = self.node.config
            self.telemetry.next_sample = now + min(config.heartbeat_interval_s, config.window_s / 4)
            self.telemetry.sample(now, self._util_files(), window_s=self.node.config.window_s)

    def _checkpoint_time(self, record: TaskRecord, now: float) -> float | None:
        """The newest checkpoint under the task's directory, walked at most every CHECKPOINT_RESCAN_S per task
        (a node of eight tasks heartbeats every few seconds; the exit report reads it afresh)."""
        cached = self.checkpoints.get(record.key)
        if cached is None or now - cached[0] >= CHECKPOINT_RESCAN_S:
            cached = (now, newest_mtime(Path(record.checkpoint_dir)))
            self.checkpoints[record.key] = cached
        return cached[1]

    def task_use(self) -> dict[TaskKey, dict[str, float]]:
        """The real CPU and memory use of each running task, one reading per heartbeat (cgroups.UseMeter:
        one pass over /proc for all of them at most), without the readings the portal would refuse."""
        out: dict[TaskKey, dict[str, float]] = {}
        for key, use in self.measure_use().items():
            where = f"{self.node.config.name} task {key[0]}"
            fields = {
                name: protocol.clean_metric(name, getattr(use, name), where=where, bounds=protocol.TASK_USE_BOUNDS)
                for name in protocol.TASK_USE_BOUNDS
            }
            out[key] = {name: value for name, value in fields.items() if value is not None}
        return out

    def task_report(self, record: TaskRecord, use: dict[str, float] | None = None) -> dict[str, Any]:
        state = "running" if record.state == "launching" else record.state
        return {
            "task_id": record.task_id,
            "attempt": record.attempt,
            "state": state,
            "pid": record.pid,
            "started_at": record.started_at,
            "checkpoint_time": self._checkpoint_time(record, self.node.clock()),
            "notebook": self._notebook_report(record),
            "service": self.service_report(record),
            "dev": self.dev_report(record),
            # cpu_used, memory_used_mb, memory_peak_mb: only what was measured (an exited task sends none)
            **(use or {}),
        }

    def _notebook_report(self, record: TaskRecord) -> dict[str, Any] | None:
        if record.notebook is None or not record.live:
            self.notebook_probes.pop(record.key, None)
            return None
        for gone in [key for key in self.notebook_probes if key not in self.node.records]:
            del self.notebook_probes[gone]
        memory = self.notebook_probes.setdefault(record.key, notebook.ProbeMemory())
        return notebook.probe(record.notebook, address=self.node.config.address, memory=memory)

    def send_if_due(self, now: float) -> None:
        node = self.node
        if now < self.next_heartbeat or not node.link.ok(now):
            return
        if not self.telemetry.latest:
            self.sample_if_due(now)
        gpus, windows, sent_xids, sent_windows = self.telemetry.outgoing()
        use = self.task_use()
        body: dict[str, Any] = {
            "gpus": gpus,
            "windows": windows,
            "tasks": [self.task_report(r, use.get(r.key)) for r in node.records.values() if not r.settled][: protocol.MAX_TASKS],
            "draining_reason": self.draining_reason(),
            "disk_problem": node.disk.problem(),
            "container_runtime": node.container_runtime[0],
            "container_runtime_note": node.container_runtime[1],
        }
        offset = node.clock_offset.estimate
        if offset is not None:
            body["clock_offset_s"], body["clock_offset_error_s"] = round(offset[0], 3), round(offset[1], 3)
        sent = node.clock()
        body["agent_time"] = sent  # before the first estimate, the portal reads the offset from this
        try:
            answer = node.link.call("heartbeat", body)
        except PortalError as exc:
            # 401: the node was removed or its token revoked; keep trying, liveness stops the work.
            # 400: something in the body was refused; drop the telemetry it may have been.
            node.log.error("portal refused the heartbeat: %s", exc)
            if exc.status == 400:
                self.telemetry.refused()
            node.link.refused()
            return
        if answer is None:
            return
        node.clock_offset.add(sent=sent, received=node.clock(), portal_time=answer.get("portal_time"))
        if node.link.client is not None and (measured := node.clock_offset.estimate) is not None:
            node.link.client.offset_s = measured[0]
        node.link.heartbeat_accepted()
        self.telemetry.acknowledged(sent_xids=sent_xids, windows=sent_windows, latest=bool(gpus))
        self.adopt_limits(answer)
        self.next_heartbeat = node.clock() + node.config.heartbeat_interval_s
        state = answer.get("node_state")
        if state != self.node_state:
            node.log.info("portal says node state is %s", state)
            self.node_state = state if isinstance(state, str) else None
        desired = answer.get("desired")
        self.reconcile(desired if isinstance(desired, list) else [])
        node.dirty = True
