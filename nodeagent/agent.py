"""The node agent: registers, heartbeats, reconciles its workloads with the portal's `desired` list.

One Agent runs one node in one thread: `run()` loops until its stop event is set. It installs no
signal handlers (the CLI does), so the fleet runner can run many Agents in one process. Each part of
the work has a home of its own, with its own state:

- identity.py   — which node this is: registration, the node token, the portal's limits (Identity);
- heartbeat.py  — the heartbeat: the task view, telemetry folded into minute windows, the answer (Heartbeats);
- launch.py     — launch and supervision of each task's process group (Workloads);
- stopping.py   — SIGTERM/grace/SIGKILL, fencing, agent-side liveness, stuck groups (Stopper);
- shipping.py   — log chunks and exit reports (Shipping);
- link.py       — one call at a time, the shared backoff, and the silence clock;
- health.py     — room on the disk and the clock's offset from the portal's;
- watchdog.py   — the separate process that stops the workloads should this agent die.

What the parts share is one context.Node (the current config, the GPUs, the clock, the log, the
link, the task records, the journal's save and its dirty flag); what one part asks of another is a
callable, wired in `Agent.__init__`. No part imports this module, so it is the only place that knows
them all.

Here: the wiring, the loop, the journal (adoption after a restart), and reconciliation.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from nodeagent import __version__, launcher, watchdog
from nodeagent import journal as journal_mod
from nodeagent.client import PortalClient
from nodeagent.config import AgentConfig, check_timeouts, with_portal_limits
from nodeagent.containers.runtime import signal_task
from nodeagent.context import AgentFatal, Node, TaskKey
from nodeagent.health import ClockOffset, DiskCheck
from nodeagent.heartbeat import Heartbeats, newest_mtime
from nodeagent.identity import Identity, identity_of
from nodeagent.journal import JournalData
from nodeagent.launch import Workloads, grace, spec_key
from nodeagent.link import PortalLink
from nodeagent.shipping import Shipping, utf8_cut
from nodeagent.stopping import Stopper
from nodeagent.topology import GpuSource

__all__ = ["Agent", "AgentFatal", "newest_mtime", "utf8_cut"]

# Settled tasks are remembered this long so a (task, attempt) is never started twice.
TOMBSTONE_TTL_S = 24 * 3600.0


class _NodeLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every line with the node's name: a fleet runs many agents in one process."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{self.extra['node'] if self.extra else '?'}] {msg}", kwargs


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        gpus: GpuSource,
        *,
        stop_event: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
        guard: watchdog.WatchdogHandle | None = None,
    ) -> None:
        self.gpus = gpus
        self.stop_event = stop_event or threading.Event()
        self.clock = clock
        self.log = _NodeLog(logging.getLogger("nodeagent"), {"node": config.name})
        self.state_dir = config.state_dir
        self.journal_path = self.state_dir / "journal.json"
        self.identity: str | None = None
        # A fleet passes one watchdog for all its agents; a lone agent has its own.
        self.watchdog = guard or watchdog.WatchdogHandle(dirs=[self.state_dir], log_dir=self.state_dir)
        self.link = PortalLink(log=self.log, clock=clock, max_backoff_s=config.heartbeat_interval_s, before_call=self.renew_lease)
        self.node = Node(
            config=config,
            gpus=gpus,
            clock=clock,
            log=self.log,
            state_dir=self.state_dir,
            link=self.link,
            disk=DiskCheck(self.state_dir),
            clock_offset=ClockOffset(),
            save=self.save,
        )
        self.records = self.node.records
        self.disk = self.node.disk
        self.clock_offset = self.node.clock_offset
        # The parts, and what each asks of another. Workloads and Stopper call each other (a time
        # limit stops a task, a task stopped before it started ends at once), and the Workloads tell
        # the Heartbeats of each start and end: those two are bound late, by lambdas, so that the
        # order the parts are made in does not matter.
        self.registration = Identity(
            self.node, stop_event=self.stop_event, adopt_limits=lambda limits: self.adopt_portal_limits(limits, save=False)
        )
        self.stopping = Stopper(
            self.node,
            finish=lambda record, status: self.workloads.finish(record, status),
            signal_sessions=lambda record, signum: self.workloads.signal_sessions(record, signum),
        )
        self.workloads = Workloads(
            self.node,
            request_stop=self.stopping.request_stop,
            escalate=self.stopping.escalate,
            heartbeat_soon=lambda: self.heartbeats.soon(),
            ensure_watchdog=self.watchdog.ensure,
        )
        self.heartbeats = Heartbeats(
            self.node,
            draining_reason=self.stopping.draining_reason,
            measure_use=self.workloads.measure_use,
            adopt_limits=self.adopt_portal_limits,
            reconcile=self.reconcile,
            service_report=self.workloads.service_report,
            dev_report=self.workloads.dev_report,
        )
        self.shipping = Shipping(self.node)

    @property
    def config(self) -> AgentConfig:
        """The current configuration: the agent's own, with the portal's limits (kept in the Node, so
        every part reads the one in force)."""
        return self.node.config

    @config.setter
    def config(self, value: AgentConfig) -> None:
        self.node.config = value

    @property
    def dirty(self) -> bool:
        """The journal has news: written at the end of this turn of the loop."""
        return self.node.dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self.node.dirty = value

    # -- lifecycle -------------------------------------------------------------------------------------
    def run(self) -> None:
        """Register if needed, adopt what the journal says runs, then loop until stopped."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.config.run_as_owner:
            self.workloads.open_task_dirs()
        token = self.registration.node_token()
        if token is None:
            return  # stopped while registering
        problem = check_timeouts(self.config)
        if problem is not None:
            # Only the portal's limits can get here (build_config checks the agent's own).
            raise AgentFatal(
                f"with the portal's limits, {problem} (the portal's YARD_AGENT_FENCE_AFTER_S, YARD_HEARTBEAT_INTERVAL_S)"
            )
        self.link.client = PortalClient(self.config.portal, token, timeout_s=self.config.http_timeout_s)
        self.identity = identity_of(token)
        self.renew_lease()  # before adopting: a watchdog about to fence our workloads must see us back
        self.adopt()
        self.log.info(
            "agent %s running with %d GPU(s)%s", __version__, len(self.gpus.gpus()), " (simulated)" if self.gpus.simulated else ""
        )
        while not self.stop_event.is_set():
            try:
                self.step()
            except Exception:
                # The workloads outlive any one bug in a turn of the loop; the next turn retries.
                self.log.exception("error in the agent loop")
            self.stop_event.wait(self.config.tick_s)
        self.workloads.probers.stop_all()
        self.save()

    def step(self) -> None:
        """One turn of the loop: renew the lease, sample, heartbeat when due, supervise, ship, check liveness."""
        now = self.clock()
        self.renew_lease()
        self.heartbeats.sample_if_due(now)
        self.heartbeats.send_if_due(now)
        self.workloads.supervise()
        self.shipping.ship_logs_if_due()
        self.shipping.flush_reports()
        self.stopping.check_liveness()
        if self.dirty:
            self.save()

    def renew_lease(self) -> None:
        try:
            watchdog.renew(self.state_dir, fence_after_s=self.config.fence_after_s, max_grace_s=self.config.max_grace_s)
        except OSError as exc:
            self.log.error("cannot renew the watchdog lease in %s: %s", self.state_dir, exc)

    def adopt_portal_limits(self, answer: dict[str, Any], *, save: bool = True) -> None:
        """Apply the limits the portal sends (register, heartbeat); keep them for the next start."""
        updated = with_portal_limits(
            self.config,
            heartbeat_interval_s=answer.get("heartbeat_interval_s"),
            stop_after_s=answer.get("stop_after_s"),
            fence_after_s=answer.get("fence_after_s"),
            max_grace_s=answer.get("max_grace_s"),
            window_s=answer.get("window_s"),
        )
        if updated != self.config:
            if updated.http_timeout_s != self.config.http_timeout_s:
                self.log.warning(
                    "HTTP timeout shortened from %g s to %g s to fit the portal's fence_after_s=%g s and heartbeat interval %g s",
                    self.config.http_timeout_s,
                    updated.http_timeout_s,
                    updated.fence_after_s,
                    updated.heartbeat_interval_s,
                )
                if self.link.client is not None:
                    self.link.client.timeout_s = updated.http_timeout_s
            elif check_timeouts(updated) is not None:
                self.log.error("the portal's limits do not fit: %s", check_timeouts(updated))
            self.config = updated
            self.link.backoff.max_s = updated.heartbeat_interval_s
            if save:
                self.registration.save_portal_limits(answer)

    # -- journal ---------------------------------------------------------------------------------------
    def save(self) -> bool:
        """Write the journal; False if the disk refused (the next turn of the loop tries again, the
        heartbeat says so, and nothing new is launched until a write succeeds)."""
        try:
            journal_mod.save(
                self.journal_path,
                JournalData(last_contact=self.link.last_contact, identity=self.identity, tasks=list(self.records.values())),
            )
        except OSError as exc:
            if self.disk.wrote(exc):
                self.log.error("cannot write the journal %s: %s; no new work starts here until it can", self.journal_path, exc)
            self.dirty = True
            return False
        if self.disk.write_error is not None:
            self.log.info("the journal %s is written again", self.journal_path)
        self.disk.wrote(None)
        self.dirty = False
        return True

    def adopt(self) -> None:
        """Take over the workloads a previous agent started; settle those that ended meanwhile."""
        try:
            data = journal_mod.load(self.journal_path)
        except (OSError, ValueError, TypeError, KeyError) as exc:
            # Guessing here could start a workload twice; a person decides.
            raise AgentFatal(
                f"the journal {self.journal_path} is unreadable ({exc!r}); move it away to start afresh "
                f"(the workloads it lists are then neither adopted nor fenced: check for them first)"
            ) from exc
        if data.identity is not None and data.identity != self.identity:
            self._forget_other_identity(data)
            self.workloads.containers.sweep()
            self.save()
            return
        if data.last_contact is not None:
            # A crash-looping agent must not reset the liveness clock on every start.
            self.link.last_contact = min(self.link.last_contact, data.last_contact)
        for record in data.tasks:
            self.records[record.key] = record
            if not record.live:
                continue
            if record.service is not None and record.state == "running" and record.pid is None:
                self._adopt_restarting(record)
                continue
            if record.pid is None and record.container and not record.container.get("id"):
                # It was waiting for its image when the agent stopped: the node's fault, the job is requeued.
                self.workloads.launch_failed(record, "the agent restarted while the task's image was pulled", cause="node_fault")
                continue
            if record.pid is None:
                record.pid = launcher.find_by_launch_id(record.launch_id)
                record.start_ticks = launcher.start_ticks(record.pid) if record.pid else None
            if record.pid is not None and launcher.process_alive(record.pid, record.start_ticks):
                if record.state == "launching":
                    record.state = "running"
                self.watchdog.ensure()
                self.log.info("adopted task %s attempt %s (pid %s)", record.task_id, record.attempt, record.pid)
                if record.state == "running":
                    self.workloads.start_probes(record)
            else:
                status = launcher.read_exit_file(record.exit_file)
                # A service that crashed while no agent watched is restarted in place, like any crash.
                if not self.workloads.restart_later(record, status):
                    self.workloads.finish(record, status)
        self.workloads.containers.sweep()
        self.save()

    def _adopt_restarting(self, record: journal_mod.TaskRecord) -> None:
        """A service the previous agent was restarting in place: its new process, if it was forked
        before the agent stopped (found by its launch id), is adopted; else it waits out its back-off
        and Workloads.restart_due starts it, rebuilt from the journaled spec."""
        info = record.service
        assert info is not None
        record.pid = launcher.find_by_launch_id(record.launch_id)
        record.start_ticks = launcher.start_ticks(record.pid) if record.pid else None
        if record.pid is None:
            if info.restart_at is None:
                info.restart_at = self.clock()  # forked and gone meanwhile, or never: start it again now
            self.log.info("task %s attempt %s: a service waiting to restart (restart %s)", *record.key, info.restarts)
            return
        info.restart_at = None
        info.run_started_at = info.run_started_at or self.clock()
        self.watchdog.ensure()
        self.log.info("adopted task %s attempt %s (pid %s), restarted in place", record.task_id, record.attempt, record.pid)
        self.workloads.start_probes(record)

    def _forget_other_identity(self, data: JournalData) -> None:
        """The journal was written under another node token: the node was re-enrolled, or the portal
        is a new one (a fresh demo database). Its task ids mean nothing to this portal and may be
        reused there, so nothing is adopted or remembered; what still runs of it is killed."""
        live = [r for r in data.tasks if r.live and r.pid is not None and launcher.process_alive(r.pid, r.start_ticks)]
        self.log.warning(
            "the journal belongs to another node token: killing %d leftover workload(s), forgetting %d task(s)",
            len(live),
            len(data.tasks),
        )
        for record in live:
            assert record.pid is not None
            signal_task(record.container, record.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.fence_grace_s
        while any(launcher.group_alive(r.pid) for r in live if r.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        for record in live:
            assert record.pid is not None
            signal_task(record.container, record.pid, signal.SIGKILL)
            self.workloads.containers.cleanup(record)

    # -- reconciliation --------------------------------------------------------------------------------
    def reconcile(self, desired: list[dict[str, Any]]) -> None:
        """Start what should run, stop what should stop, and fence whatever is not in `desired`."""
        wanted: dict[TaskKey, dict[str, Any]] = {}
        for spec in desired:
            try:
                wanted[spec_key(spec)] = spec
            except (KeyError, TypeError, ValueError):
                self.log.error("ignoring a malformed task spec: %r", spec)
        for key, spec in wanted.items():
            record = self.records.get(key)
            if record is not None and spec.get("started") and not record.running_reported:
                record.running_reported = True  # the portal recorded its start (from a heartbeat)
                self.dirty = True
            if spec.get("action") == "stop":
                if record is not None and record.live:
                    self.stopping.request_stop(
                        record,
                        cause="stop",
                        grace_s=grace(spec.get("grace_s"), default=record.grace_s),
                        reason=spec.get("stop_reason"),
                    )
            elif record is None:
                try:
                    self.workloads.launch(spec)
                except (KeyError, TypeError, ValueError) as exc:
                    self.log.error("cannot start a malformed task spec (%r): %r", exc, spec)
            elif record.dev is not None and record.live:
                self.workloads.dev_keys(record, spec)  # a key added or removed in the portal, without a restart
        now = self.clock()
        for key, record in list(self.records.items()):
            if key in wanted:
                continue
            if record.live:
                self.log.warning("fencing task %s attempt %s: the portal no longer assigns it here", *key)
                self.stopping.request_stop(record, cause="fenced", grace_s=self.config.fence_grace_s, reason=None)
            elif not record.settled and record.state == "exited":
                # Ended, and the portal no longer knows it: there is nothing to report to anyone.
                record.running_reported = True
            elif record.settled and (record.ended_at or 0) < now - TOMBSTONE_TTL_S:
                del self.records[key]

    def with_config(self, **changes: Any) -> None:
        """For tests: change the configuration of a running agent."""
        self.config = replace(self.config, **changes)
