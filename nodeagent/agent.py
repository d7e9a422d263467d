"""The node agent: registers, heartbeats, reconciles its workloads with the portal's `desired` list.

One Agent runs one node in one thread: `run()` loops until its stop event is set. It installs no
signal handlers (the CLI does), so the fleet runner can run many Agents in one process. Every
portal call is a single attempt; failures put all calls behind one shared backoff, while the
workloads keep running until the portal has been unreachable for `stop_after_s`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from nodeagent import __version__, launcher, notebook
from nodeagent import journal as journal_mod
from nodeagent.client import Backoff, PortalClient, PortalError, PortalUnreachable
from nodeagent.config import (
    BACKOFF_INITIAL_S,
    DEFAULT_GRACE_S,
    LOG_CHUNK_BYTES,
    LOG_CHUNKS_PER_ROUND,
    LOG_SHIP_INTERVAL_S,
    MAX_GRACE_S,
    MAX_ORDERED_GRACE_S,
    MAX_PENDING_XIDS,
    AgentConfig,
    with_portal_limits,
)
from nodeagent.journal import JournalData, TaskRecord
from nodeagent.topology import GpuSource

ENROLMENT_PREFIX = "yen_"
TASK_SPEC_FIELDS = (
    "task_id",
    "job_id",
    "attempt",
    "kind",
    "rank",
    "world_size",
    "node_rank",
    "local_rank",
    "master_addr",
    "master_port",
    "gpus",
    "command",
    "env",
    "checkpoint_dir",
    "time_limit_s",
    "action",
    "grace_s",
    "stop_reason",
)
# Bounds the walk for the newest checkpoint file, so a huge checkpoint tree cannot stall heartbeats.
CHECKPOINT_SCAN_LIMIT = 10_000
# Settled tasks are remembered this long so a (task, attempt) is never started twice.
TOMBSTONE_TTL_S = 24 * 3600.0


class _NodeLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """Prefixes every line with the node's name: a fleet runs many agents in one process."""

    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{self.extra['node'] if self.extra else '?'}] {msg}", kwargs


class AgentFatal(Exception):
    """The agent cannot go on (refused enrolment, name taken…); the message is for the operator."""


def _spec_key(spec: dict[str, Any]) -> tuple[int, int]:
    return int(spec["task_id"]), int(spec["attempt"])


def newest_mtime(root: Path) -> float | None:
    """mtime of the newest file under `root` (the task's last checkpoint), or None if there is none."""
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


def _grace(value: Any, *, default: float) -> float:
    """The spec's grace period (0 is a valid one), as the portal ordered it (bounded against nonsense).

    A long grace cannot break the liveness arithmetic: while the portal answers it knows the task is
    stopping, and once the agent loses it _check_liveness cuts every grace to MAX_GRACE_S.
    """
    return min(default if value is None else max(0.0, float(value)), MAX_ORDERED_GRACE_S)


def utf8_cut(raw: bytes) -> int:
    """Length of the longest prefix of `raw` that does not end inside a UTF-8 character."""
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 != 0x80:  # the lead byte of the last character
            needed = 1 if byte < 0x80 else 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
            return len(raw) if needed <= back else len(raw) - back
    return len(raw)


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        gpus: GpuSource,
        *,
        stop_event: threading.Event | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.gpus = gpus
        self.stop_event = stop_event or threading.Event()
        self.clock = clock
        self.log = _NodeLog(logging.getLogger("nodeagent"), {"node": config.name})
        self.state_dir = config.state_dir
        self.journal_path = self.state_dir / "journal.json"
        self.records: dict[tuple[int, int], TaskRecord] = {}
        self.children: dict[tuple[int, int], subprocess.Popen[bytes]] = {}
        self.client: PortalClient | None = None
        self.backoff = Backoff(initial_s=BACKOFF_INITIAL_S, max_s=config.heartbeat_interval_s)
        self.retry_at = 0.0
        self.next_heartbeat = 0.0
        self.next_log_ship = 0.0
        self.last_contact = clock()
        self.node_state: str | None = None
        self.pending_xids: dict[int, list[int]] = {}
        self.drains_posted: set[tuple[int, int]] = set()
        self.liveness_tripped = False
        self.dirty = False
        self.identity: str | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    def run(self) -> None:
        """Register if needed, adopt what the journal says runs, then loop until stopped."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        if self.config.run_as_owner:
            self._open_task_dirs()
        token = self._node_token()
        if token is None:
            return  # stopped while registering
        self.client = PortalClient(self.config.portal, token, timeout_s=self.config.http_timeout_s)
        self.identity = hashlib.sha256(token.encode()).hexdigest()[:16]
        self._adopt()
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
        self._save()

    def step(self) -> None:
        """One turn of the loop: heartbeat when due, supervise processes, ship logs and reports."""
        now = self.clock()
        if now >= self.next_heartbeat and self._portal_ok(now):
            self._heartbeat()
        self._supervise()
        if self.clock() >= self.next_log_ship:
            self.next_log_ship = self.clock() + LOG_SHIP_INTERVAL_S
            self._ship_logs()
        self._flush_reports()
        self._check_liveness()
        if self.dirty:
            self._save()

    # -- registration ----------------------------------------------------------------------------------
    def _node_token(self) -> str | None:
        token_file = self.state_dir / "node-token"
        if not self.config.token.startswith(ENROLMENT_PREFIX):
            return self.config.token
        if token_file.exists():
            self._load_portal_limits()
            return token_file.read_text().strip()
        enrol = PortalClient(self.config.portal, self.config.token, timeout_s=self.config.http_timeout_s)
        body = {
            "name": self.config.name,
            "address": self.config.address,
            "leaf": self.config.leaf,
            "spine": self.config.spine,
            "simulated": self.gpus.simulated,
            "agent_version": __version__,
            "gpus": [gpu.to_json() for gpu in self.gpus.gpus()],
        }
        backoff = Backoff(initial_s=BACKOFF_INITIAL_S, max_s=30.0)
        while not self.stop_event.is_set():
            try:
                answer = enrol.post("register", body)
                break
            except PortalUnreachable as exc:
                delay = backoff.next_delay()
                self.log.warning("cannot register with %s (%s); retrying in %.1f s", self.config.portal, exc, delay)
                self.stop_event.wait(delay)
            except PortalError as exc:
                raise AgentFatal(self._register_refusal(exc)) from exc
        else:
            return None
        token = str(answer["token"])
        journal_mod.atomic_write(token_file, token + "\n", mode=0o600)
        journal_mod.atomic_write(
            self.state_dir / "node.json",
            json.dumps(
                {
                    "node": answer.get("node"),
                    "heartbeat_interval_s": answer.get("heartbeat_interval_s"),
                    "stop_after_s": answer.get("stop_after_s"),
                }
            ),
        )
        self._load_portal_limits()
        self.log.info("registered as %s", answer.get("node"))
        return token

    def _register_refusal(self, exc: PortalError) -> str:
        if exc.status == 409:
            return (
                f"node {self.config.name!r} is registered already: pass its node token (ynd_…) with --token, "
                f"or remove the node in the portal and enrol it again"
            )
        if exc.status == 401:
            return "the portal refused the enrolment token (unknown or revoked)"
        return f"the portal refused the registration: HTTP {exc.status} {exc.body}"

    def _load_portal_limits(self) -> None:
        try:
            saved = json.loads((self.state_dir / "node.json").read_text())
        except (OSError, ValueError):
            return
        if isinstance(saved, dict):
            self.config = with_portal_limits(
                self.config, heartbeat_interval_s=saved.get("heartbeat_interval_s"), stop_after_s=saved.get("stop_after_s")
            )
            self.backoff.max_s = self.config.heartbeat_interval_s

    # -- journal ---------------------------------------------------------------------------------------
    def _save(self) -> None:
        journal_mod.save(
            self.journal_path,
            JournalData(last_contact=self.last_contact, identity=self.identity, tasks=list(self.records.values())),
        )
        self.dirty = False

    def _adopt(self) -> None:
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
            self._save()
            return
        if data.last_contact is not None:
            # A crash-looping agent must not reset the liveness clock on every start.
            self.last_contact = min(self.last_contact, data.last_contact)
        for record in data.tasks:
            self.records[record.key] = record
            if not record.live:
                continue
            if record.pid is None:
                record.pid = launcher.find_by_launch_id(record.launch_id)
                record.start_ticks = launcher.start_ticks(record.pid) if record.pid else None
            if record.pid is not None and launcher.process_alive(record.pid, record.start_ticks):
                if record.state == "launching":
                    record.state = "running"
                self.log.info("adopted task %s attempt %s (pid %s)", record.task_id, record.attempt, record.pid)
            else:
                self._finish(record, launcher.read_exit_file(record.exit_file))
        self._save()

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
            launcher.signal_group(record.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.config.fence_grace_s
        while any(launcher.group_alive(r.pid) for r in live if r.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        for record in live:
            assert record.pid is not None
            launcher.signal_group(record.pid, signal.SIGKILL)

    # -- portal calls ----------------------------------------------------------------------------------
    def _portal_ok(self, now: float) -> bool:
        return now >= self.retry_at

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """POST, or None when the portal is unreachable (then every call waits for the backoff)."""
        assert self.client is not None
        try:
            answer = self.client.post(path, body)
        except PortalUnreachable as exc:
            delay = self.backoff.next_delay()
            self.retry_at = self.clock() + delay
            self.log.warning("portal unreachable on %s (%s); retrying in %.1f s", path, exc, delay)
            return None
        self._contact()
        return answer

    def _contact(self) -> None:
        self.backoff.reset()
        self.retry_at = 0.0
        self.last_contact = self.clock()
        if self.liveness_tripped:
            self.log.info("portal reachable again")
            self.liveness_tripped = False

    # -- heartbeat and reconciliation ------------------------------------------------------------------
    def _util_files(self) -> dict[int, Path]:
        files: dict[int, Path] = {}
        for record in self.records.values():
            if record.live:
                files.update({index: record.util_file for index in record.gpus})
        return files

    def _task_report(self, record: TaskRecord) -> dict[str, Any]:
        state = "running" if record.state == "launching" else record.state
        return {
            "task_id": record.task_id,
            "attempt": record.attempt,
            "state": state,
            "pid": record.pid,
            "checkpoint_time": newest_mtime(Path(record.checkpoint_dir)),
            "notebook": (
                notebook.probe(record.notebook, address=self.config.address)
                if record.notebook is not None and record.live
                else None
            ),
        }

    def draining_reason(self) -> str | None:
        now = self.clock()
        stuck = [
            r
            for r in self.records.values()
            if r.state == "stopping" and r.sigkill_at is not None and now - r.sigkill_at >= self.config.unkillable_after_s
        ]
        if not stuck:
            return None
        return "; ".join(
            f"task {r.task_id} attempt {r.attempt} (pid {r.pid}) survived SIGKILL for {self.config.unkillable_after_s:.0f} s"
            for r in stuck
        )

    def _heartbeat(self) -> None:
        samples = self.gpus.sample(self._util_files())
        for sample in samples:
            pending = self.pending_xids.setdefault(sample.index, [])
            pending.extend(sample.xid_errors)
            del pending[:-MAX_PENDING_XIDS]
        sent = {index: len(codes) for index, codes in self.pending_xids.items()}
        body = {
            "gpus": [{**s.to_json(), "xid_errors": list(self.pending_xids.get(s.index, []))} for s in samples],
            "tasks": [self._task_report(r) for r in self.records.values() if not r.settled],
            "draining_reason": self.draining_reason(),
        }
        try:
            answer = self._call("heartbeat", body)
        except PortalError as exc:
            # 401: the node was removed or its token revoked. Keep trying; liveness stops the work.
            self.log.error("portal refused the heartbeat: %s", exc)
            self.retry_at = self.clock() + self.backoff.next_delay()
            return
        if answer is None:
            return
        for index, count in sent.items():
            del self.pending_xids[index][:count]
        interval = answer.get("heartbeat_interval_s")
        if isinstance(interval, int | float) and interval > 0 and interval != self.config.heartbeat_interval_s:
            self.config = replace(self.config, heartbeat_interval_s=float(interval))
            self.backoff.max_s = float(interval)
        self.next_heartbeat = self.clock() + self.config.heartbeat_interval_s
        state = answer.get("node_state")
        if state != self.node_state:
            self.log.info("portal says node state is %s", state)
            self.node_state = state if isinstance(state, str) else None
        desired = answer.get("desired")
        self.reconcile(desired if isinstance(desired, list) else [])
        self.dirty = True

    def reconcile(self, desired: list[dict[str, Any]]) -> None:
        """Start what should run, stop what should stop, and fence whatever is not in `desired`."""
        wanted: dict[tuple[int, int], dict[str, Any]] = {}
        for spec in desired:
            try:
                wanted[_spec_key(spec)] = spec
            except (KeyError, TypeError, ValueError):
                self.log.error("ignoring a malformed task spec: %r", spec)
        for key, spec in wanted.items():
            record = self.records.get(key)
            if spec.get("action") == "stop":
                if record is not None and record.live:
                    grace = _grace(spec.get("grace_s"), default=record.grace_s)
                    self._request_stop(record, cause="stop", grace_s=grace, reason=spec.get("stop_reason"))
            elif record is None:
                try:
                    self._launch(spec)
                except (KeyError, TypeError, ValueError) as exc:
                    self.log.error("cannot start a malformed task spec (%r): %r", exc, spec)
        now = self.clock()
        for key, record in list(self.records.items()):
            if key in wanted:
                continue
            if record.live:
                self.log.warning("fencing task %s attempt %s: the portal no longer assigns it here", *key)
                self._request_stop(record, cause="fenced", grace_s=self.config.fence_grace_s, reason=None)
            elif record.settled and (record.ended_at or 0) < now - TOMBSTONE_TTL_S:
                del self.records[key]

    # -- launching -------------------------------------------------------------------------------------
    def _checkpoint_dir(self, spec: dict[str, Any]) -> Path:
        raw = spec.get("checkpoint_dir")
        path = Path(str(raw)) if raw else Path(f"job-{spec['job_id']}")
        return path if path.is_absolute() else self.state_dir / "checkpoints" / path

    def _open_task_dirs(self) -> None:
        """Task owners must be able to reach their working directories (search permission on every
        directory above them), and nothing more: the tasks and checkpoints folders are mode 0711."""
        folder = launcher.closed_to_others(self.state_dir)
        if folder is not None:
            raise AgentFatal(
                f"--run-as-owner: task owners cannot reach {self.state_dir}, because {folder} is mode "
                f"{folder.stat().st_mode & 0o777:o}; give it o+x (chmod o+x {folder}) or choose another --state-dir"
            )
        for name in ("tasks", "checkpoints"):
            (self.state_dir / name).mkdir(exist_ok=True)
            (self.state_dir / name).chmod(0o711)
        if launcher.closed_to_others(Path(sys.executable)) is not None:
            self.log.warning(
                "--run-as-owner: notebooks will fail: task owners cannot run this agent's Python (%s)", sys.executable
            )

    def _owner_account(self, spec: dict[str, Any]) -> tuple[pwd.struct_passwd | None, str]:
        """The local account of the task's owner, or None and what to do about it."""
        owner = str(spec.get("user") or "")
        if not owner:
            return None, "the portal sent no owner for this task, and this agent runs tasks as their owners (--run-as-owner)"
        try:
            account = pwd.getpwnam(owner)
        except KeyError:
            return None, (
                f"the job's owner {owner!r} has no local account on node {self.config.name}: add the account "
                "(LDAP/SSSD or useradd), or run the agent without --run-as-owner"
            )
        if account.pw_uid == 0:
            return None, f"refusing to run a task as root (owner {owner!r} maps to uid 0)"
        return account, ""

    def _hand_over(self, record: TaskRecord, account: pwd.struct_passwd) -> None:
        """The owner gets its working directory and checkpoint directory (mode 0700: other accounts on
        the node read neither) and the (simulated) utilisation file; the task directory itself, with
        the log (0600: the task writes it through the descriptor it inherits) and the exit status,
        stays the agent's."""
        Path(record.workdir).chmod(0o711)
        record.log_path.touch(mode=0o600)
        record.log_path.chmod(0o600)
        record.run_dir.mkdir(mode=0o700, exist_ok=True)
        ids = (account.pw_uid, account.pw_gid)
        if self.gpus.simulated:
            record.util_file.touch()
            os.chown(record.util_file, *ids)
        for path in (record.run_dir, Path(record.checkpoint_dir)):
            os.chown(path, *ids)
            path.chmod(0o700)

    def _task_env(self, spec: dict[str, Any], record: TaskRecord, account: pwd.struct_passwd | None = None) -> dict[str, str]:
        gpus = [int(i) for i in spec.get("gpus") or []]
        env = {**os.environ, **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}
        if account is not None:
            env.update({"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name})
        # The agent's variables win over the spec's: a task must not widen its own GPUs.
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpus),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "MASTER_ADDR": str(spec.get("master_addr") or self.config.address),
                "MASTER_PORT": str(spec.get("master_port") or 29500),
                "WORLD_SIZE": str(spec.get("world_size", 1)),
                "RANK": str(spec.get("rank", 0)),
                "NODE_RANK": str(spec.get("node_rank", spec.get("rank", 0))),
                "LOCAL_RANK": str(spec.get("local_rank", 0)),
                "YARD_JOB_ID": str(spec["job_id"]),
                "YARD_TASK_ID": str(record.task_id),
                "YARD_ATTEMPT": str(record.attempt),
                "YARD_NUM_GPUS": str(len(gpus)),
                "YARD_CHECKPOINT_DIR": record.checkpoint_dir,
                "YARD_WORKDIR": str(record.run_dir),
                "YARD_LAUNCH_ID": record.launch_id,
            }
        )
        if self.gpus.simulated:
            env["YARD_SIM_UTIL_FILE"] = str(record.util_file)
        return env

    def _launch(self, spec: dict[str, Any]) -> None:
        task_id, attempt = _spec_key(spec)
        workdir = self.state_dir / "tasks" / f"{task_id}-{attempt}"
        time_limit = spec.get("time_limit_s")
        record = TaskRecord(
            task_id=task_id,
            attempt=attempt,
            job_id=int(spec["job_id"]),
            kind=str(spec.get("kind") or "batch"),
            launch_id=uuid.uuid4().hex,
            workdir=str(workdir),
            checkpoint_dir=str(self._checkpoint_dir(spec)),
            time_limit_s=float(time_limit) if time_limit else None,
            grace_s=_grace(spec.get("grace_s"), default=DEFAULT_GRACE_S),
            gpus=[int(i) for i in spec.get("gpus") or []],
        )
        command = str(spec.get("command") or "")
        unknown = sorted(set(record.gpus) - {gpu.index for gpu in self.gpus.gpus()})
        if unknown:
            self._launch_failed(record, f"this node has no GPU {unknown}")
            return
        account: pwd.struct_passwd | None = None
        if self.config.run_as_owner:
            account, problem = self._owner_account(spec)
            if account is None:
                self._launch_failed(record, problem)
                return
            record.run_as = account.pw_name
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            Path(record.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            if account is not None:
                self._hand_over(record, account)
            env = self._task_env(spec, record, account)
            if record.kind == "notebook":
                closed = launcher.closed_to_others(Path(sys.executable)) if account is not None else None
                if closed is not None:
                    self._launch_failed(
                        record,
                        f"a notebook runs this agent's Python ({sys.executable}) as its owner, but {closed} is closed "
                        "to other users: install the agent where every account can run it (e.g. /opt/yard-agent)",
                    )
                    return
                record.notebook = notebook.plan_notebook(address=self.config.address, env=env)
                command = notebook.notebook_command(record.notebook, address=self.config.address, root_dir=record.run_dir)
                # Jupyter's runtime files (kernel connection files) per task, whatever the owner's home.
                env["JUPYTER_RUNTIME_DIR"] = str(record.run_dir / ".jupyter-runtime")
        except OSError as exc:
            self._launch_failed(record, f"cannot prepare the task: {exc}")
            return
        # Journal first: should the agent die right after the fork, the restarted agent finds the
        # process by its launch id instead of starting it a second time.
        self.records[record.key] = record
        self._save()
        try:
            child = launcher.spawn(
                command=command,
                env=env,
                cwd=record.run_dir,
                log_path=record.log_path,
                exit_file=record.exit_file,
                owner=(account.pw_uid, account.pw_gid) if account is not None else None,
            )
        except OSError as exc:
            self._launch_failed(record, f"cannot start the task: {exc}")
            return
        self.children[record.key] = child
        record.pid = child.pid
        record.start_ticks = launcher.start_ticks(child.pid)
        record.started_at = self.clock()
        record.state = "running"
        self._save()
        self.log.info("started task %s attempt %s (pid %s) on GPUs %s", task_id, attempt, child.pid, record.gpus)

    def _launch_failed(self, record: TaskRecord, message: str) -> None:
        """The failure goes into the task's log, so the user sees it in the portal."""
        self.log.error("task %s attempt %s: %s", record.task_id, record.attempt, message)
        self.records[record.key] = record
        try:
            Path(record.workdir).mkdir(parents=True, exist_ok=True)
            with open(record.log_path, "a") as handle:
                handle.write(f"yard-agent: {message}\n")
        except OSError:
            pass
        record.started_at = self.clock()
        self._finish(record, None)

    # -- supervision -----------------------------------------------------------------------------------
    def _leader_status(self, record: TaskRecord) -> tuple[bool, int | None]:
        """(has the leader exited, its status if known)."""
        child = self.children.get(record.key)
        if child is not None:
            status = child.poll()
            return status is not None, status
        assert record.pid is not None
        if launcher.process_alive(record.pid, record.start_ticks):
            return False, None
        return True, launcher.read_exit_file(record.exit_file)

    def _supervise(self) -> None:
        for record in list(self.records.values()):
            if record.pid is None or record.state not in ("running", "stopping"):
                continue
            exited, status = self._leader_status(record)
            now = self.clock()
            if record.state == "running":
                if exited:
                    # Whatever the workload left behind in its group goes with it.
                    launcher.signal_group(record.pid, signal.SIGKILL)
                    self._finish(record, status)
                elif record.time_limit_s and record.started_at and now - record.started_at > record.time_limit_s:
                    self._request_stop(record, cause="time_limit", grace_s=record.grace_s, reason="time limit")
                continue
            if exited and not launcher.group_alive(record.pid):
                self._finish(record, status)
            elif record.sigkill_at is None and record.stop_deadline is not None and now >= record.stop_deadline:
                self.log.warning("task %s attempt %s outlived its grace: SIGKILL", record.task_id, record.attempt)
                launcher.signal_group(record.pid, signal.SIGKILL)
                record.sigkill_at = now
                self.dirty = True
            elif record.sigkill_at is not None and now - record.sigkill_at >= self.config.unkillable_after_s:
                self._drain_for(record)

    def _request_stop(self, record: TaskRecord, *, cause: str, grace_s: float, reason: str | None) -> None:
        now = self.clock()
        if record.state == "stopping":
            # A later, more urgent stop (fencing) may only shorten the grace.
            if record.stop_deadline is None or now + grace_s < record.stop_deadline:
                record.stop_deadline = now + grace_s
                self.dirty = True
            return
        if record.pid is None:
            return
        self.log.info("stopping task %s attempt %s (%s, grace %.0f s)", record.task_id, record.attempt, cause, grace_s)
        record.state = "stopping"
        record.stop_cause = cause
        record.stop_reason = reason
        record.sigterm_at = now
        record.stop_deadline = now + grace_s
        launcher.signal_group(record.pid, signal.SIGTERM)
        self._save()

    def _finish(self, record: TaskRecord, status: int | None) -> None:
        exit_code, signum = launcher.decode_status(status)
        if status is None and record.sigkill_at is not None:
            signum = int(signal.SIGKILL)  # killed wrapper and all: it could not record a status
        record.exit_code, record.signal = exit_code, signum
        if record.sigterm_at is not None:
            record.stopped_by = "sigkill" if record.sigkill_at is not None else "sigterm"
        record.state = "exited"
        record.ended_at = self.clock()
        self.children.pop(record.key, None)
        self._save()
        self.log.info(
            "task %s attempt %s ended: exit %s signal %s stopped_by %s",
            record.task_id,
            record.attempt,
            exit_code,
            signum,
            record.stopped_by,
        )

    def _drain_for(self, record: TaskRecord) -> None:
        if record.key in self.drains_posted:
            return
        reason = (
            f"task {record.task_id} attempt {record.attempt} (pid {record.pid}) survived SIGKILL for "
            f"{self.config.unkillable_after_s:.0f} s"
        )
        self.log.error("draining the node: %s", reason)
        if self._portal_ok(self.clock()):
            try:
                if self._call("drain", {"reason": reason}) is not None:
                    self.drains_posted.add(record.key)
            except PortalError as exc:
                self.log.error("portal refused the drain: %s", exc)
                self.drains_posted.add(record.key)

    def _check_liveness(self) -> None:
        """Past stop_after_s without the portal, stop the workloads: the portal will requeue them."""
        if self.clock() - self.last_contact <= self.config.stop_after_s:
            return
        running = [r for r in self.records.values() if r.state == "running"]
        if running and not self.liveness_tripped:
            self.log.error("portal unreachable for %.0f s: stopping %d task(s)", self.clock() - self.last_contact, len(running))
        self.liveness_tripped = True
        # Stopping ones too: a long grace the portal ordered is cut short, so that everything here is
        # gone before the portal declares the node DOWN and starts the work elsewhere.
        for record in [r for r in self.records.values() if r.state in ("running", "stopping")]:
            self._request_stop(record, cause="portal_unreachable", grace_s=min(record.grace_s, MAX_GRACE_S), reason=None)

    # -- logs and status reports -----------------------------------------------------------------------
    def _ship_logs(self) -> None:
        for record in list(self.records.values()):
            if record.state != "launching" and not record.log_closed:
                self._ship_log_round(record)

    def _ship_log_round(self, record: TaskRecord) -> None:
        """A bounded number of chunks per task and turn: a chatty workload must not stall the loop."""
        for _ in range(LOG_CHUNKS_PER_ROUND):
            if not self._ship_log_chunk(record):
                return

    def _ship_log_chunk(self, record: TaskRecord) -> bool:
        """Send the next chunk of the task's log; True if there may be more to send right now."""
        if not self._portal_ok(self.clock()):
            return False
        try:
            with open(record.log_path, "rb") as handle:
                handle.seek(record.log_file_pos)
                raw = handle.read(LOG_CHUNK_BYTES)
        except OSError:
            raw = b""
        at_final_end = record.state == "exited" and len(raw) < LOG_CHUNK_BYTES
        if not at_final_end:
            raw = raw[: utf8_cut(raw)]  # the rest of a split character comes with the next chunk
        if not raw:
            if record.state == "exited":
                record.log_closed = True
            return False
        data = raw.decode("utf-8", errors="replace")
        try:
            answer = self._call(
                f"tasks/{record.task_id}/logs", {"attempt": record.attempt, "offset": record.log_offset, "data": data}
            )
        except PortalError as exc:
            self.log.warning("portal refused the log of task %s attempt %s: %s", record.task_id, record.attempt, exc)
            record.log_closed = True
            return False
        if answer is None:
            return False
        record.log_file_pos += len(raw)
        record.log_offset += len(data.encode("utf-8"))
        return True

    def _flush_reports(self) -> None:
        for record in list(self.records.values()):
            if record.state == "launching" or record.settled:
                continue
            # The start is reported even for a task that ended at once: the portal sees both events.
            if not record.running_reported and self._portal_ok(self.clock()):
                self._report(record, exited=False)
            if record.state == "exited" and record.running_reported and self._portal_ok(self.clock()):
                if not record.log_closed:
                    self._ship_log_round(record)
                if record.log_closed:
                    self._report(record, exited=True)

    def _report(self, record: TaskRecord, *, exited: bool) -> None:
        body = {
            "attempt": record.attempt,
            "state": "exited" if exited else "running",
            "pid": record.pid,
            "exit_code": record.exit_code if exited else None,
            "signal": record.signal if exited else None,
            "stopped_by": record.stopped_by if exited else None,
            "stop_cause": record.stop_cause if exited else None,
            "started_at": record.started_at,
            "ended_at": record.ended_at if exited else None,
            "notebook_url": record.notebook.url if record.notebook else None,
        }
        try:
            answer = self._call(f"tasks/{record.task_id}/status", body)
        except PortalError as exc:
            if exc.status in (404, 409):
                self.log.warning("portal says task %s attempt %s is stale (%s)", record.task_id, record.attempt, exc.code)
                if record.live:
                    self._request_stop(record, cause="fenced", grace_s=self.config.fence_grace_s, reason=None)
                # Nothing more of this attempt is wanted: not its log, not its end.
                record.log_closed = True
                exited = record.state == "exited"
            else:
                self.log.error("portal refused the status of task %s: %s", record.task_id, exc)
                exited = record.state == "exited"
            answer = {}
        if answer is None:
            return
        record.running_reported = True
        record.exit_reported = exited
        self.dirty = True
