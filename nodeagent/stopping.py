"""Stopping: SIGTERM, the grace the order asks for, SIGKILL; fencing; agent-side liveness; stuck groups.

Every stop goes through ``request_stop``: a stop the portal ordered (preemption, cancel, idle reaping),
a time limit, fencing (the portal no longer assigns the task here: a short grace), and agent-side
liveness (``check_liveness``: the portal has not accepted a heartbeat for ``stop_after_s``, counted as
the portal counts it — nodeagent/link.py). A later, more urgent stop may only shorten a grace.

The timings fit the portal's (docs/agent-api.md): a node's work is gone before the portal declares
the node DOWN and starts its jobs elsewhere, whether the agent stopped it here or, the agent being
gone, the node's watchdog did (nodeagent/watchdog.py).
"""

from __future__ import annotations

import signal
from collections.abc import Callable

from nodeagent import launcher
from nodeagent.client import PortalError
from nodeagent.containers.runtime import signal_task
from nodeagent.context import Node, TaskKey
from nodeagent.journal import TaskRecord


class Stopper:
    """Stops tasks; `finish` (the Workloads') records the end of one that never started."""

    def __init__(
        self,
        node: Node,
        *,
        finish: Callable[[TaskRecord, int | None], None],
        signal_sessions: Callable[[TaskRecord, signal.Signals], None] = lambda record, signum: None,
    ) -> None:
        self.node = node
        self.finish = finish
        # A dev session's SSH sessions left its process group (nodeagent/devsession.py): they get its signals too.
        self.signal_sessions = signal_sessions
        self.drains_posted: set[TaskKey] = set()

    def request_stop(self, record: TaskRecord, *, cause: str, grace_s: float, reason: str | None) -> None:
        node = self.node
        now = node.clock()
        if record.state == "stopping":
            # A later, more urgent stop (fencing) may only shorten the grace.
            if record.stop_deadline is None or now + grace_s < record.stop_deadline:
                record.stop_deadline = now + grace_s
                node.dirty = True
            return
        if record.pid is None:
            # Recorded but never started (its launch failed before the fork, or the agent died there):
            # a process may yet be found by its launch id; if none is, the stop is done at once.
            record.pid = launcher.find_by_launch_id(record.launch_id)
            record.start_ticks = launcher.start_ticks(record.pid) if record.pid else None
        if record.pid is None:
            if record.service is not None and record.service.restart_at is not None:
                # A service between a crash and its restart: it ends now, and is never started again.
                node.log.info("task %s attempt %s stopped while waiting to restart (%s)", record.task_id, record.attempt, cause)
            else:
                node.log.info("task %s attempt %s never started: ended (%s)", record.task_id, record.attempt, cause)
            record.stop_cause = cause
            self.finish(record, None)
            return
        node.log.info("stopping task %s attempt %s (%s, grace %.0f s)", record.task_id, record.attempt, cause, grace_s)
        record.state = "stopping"
        record.stop_cause = cause
        record.stop_reason = reason
        record.sigterm_at = now
        record.stop_deadline = now + grace_s
        self.signal_sessions(record, signal.SIGTERM)
        signal_task(record.container, record.pid, signal.SIGTERM)
        node.save()

    def escalate(self, record: TaskRecord, now: float) -> None:
        """A stopping task still alive: SIGKILL at the end of its grace; drain the node if even that fails."""
        assert record.pid is not None
        if record.sigkill_at is None and record.stop_deadline is not None and now >= record.stop_deadline:
            self.node.log.warning("task %s attempt %s outlived its grace: SIGKILL", record.task_id, record.attempt)
            self.signal_sessions(record, signal.SIGKILL)
            signal_task(record.container, record.pid, signal.SIGKILL)
            record.sigkill_at = now
            self.node.dirty = True
        elif record.sigkill_at is not None and now - record.sigkill_at >= self.node.config.unkillable_after_s:
            self.drain_for(record)

    def draining_reason(self) -> str | None:
        now = self.node.clock()
        after = self.node.config.unkillable_after_s
        stuck = [
            r
            for r in self.node.records.values()
            if r.state == "stopping" and r.sigkill_at is not None and now - r.sigkill_at >= after
        ]
        if not stuck:
            return None
        return "; ".join(f"task {r.task_id} attempt {r.attempt} (pid {r.pid}) survived SIGKILL for {after:.0f} s" for r in stuck)

    def drain_for(self, record: TaskRecord) -> None:
        node = self.node
        if record.key in self.drains_posted:
            return
        reason = (
            f"task {record.task_id} attempt {record.attempt} (pid {record.pid}) survived SIGKILL for "
            f"{node.config.unkillable_after_s:.0f} s"
        )
        node.log.error("draining the node: %s", reason)
        if node.link.ok(node.clock()):
            try:
                if node.link.call("drain", {"reason": reason}) is not None:
                    self.drains_posted.add(record.key)
            except PortalError as exc:
                node.log.error("portal refused the drain: %s", exc)
                self.drains_posted.add(record.key)

    def check_liveness(self) -> None:
        """Past stop_after_s of silence (as the portal counts it), stop the workloads: the portal will requeue them."""
        node = self.node
        silence = node.link.silence()
        if silence <= node.config.stop_after_s:
            return
        running = [r for r in node.records.values() if r.state == "running"]
        if running and not node.link.lost:
            node.log.error("portal has not accepted a heartbeat for %.0f s: stopping %d task(s)", silence, len(running))
        node.link.lost = True
        # Stopping ones too: a long grace the portal ordered is cut short, so that everything here is
        # gone before the portal declares the node DOWN and starts the work elsewhere.
        cap = node.config.max_grace_s
        for record in [r for r in node.records.values() if r.state in ("running", "stopping")]:
            self.request_stop(record, cause="portal_unreachable", grace_s=min(record.grace_s, cap), reason=None)
