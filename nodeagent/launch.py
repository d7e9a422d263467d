"""Launch and supervision: starting a task's process group, watching it, recording how it ended.

A (task, attempt) is written to the journal before its process is forked, so an agent that dies
right after the fork finds the process by its launch id instead of starting it twice. The workload's
own exit status comes from the launcher's wrapper (nodeagent/launcher.py), so a restarted agent, no
longer its parent, still learns it.

A service replica's process that exits while nobody told it to stop does not end its task: it is
started again in place after a back-off, under a fresh launch id journaled first as at any launch
(`restart_later`, `restart_due`; the counting in nodeagent/service.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from nodeagent import cgroups, devsession, hostlist, launcher, notebook, service
from nodeagent.config import DEFAULT_GRACE_S, MAX_ORDERED_GRACE_S
from nodeagent.containers.base import ContainerPlan
from nodeagent.containers.cdi import CdiError
from nodeagent.containers.images import Image
from nodeagent.containers.runtime import signal_task
from nodeagent.containers.tasks import Containers, Waiting, container_env
from nodeagent.context import AgentFatal, Node, TaskKey
from nodeagent.journal import TaskRecord
from nodeagent.service import Prober, Probers, ServiceInfo


def gang_env(spec: dict[str, Any], *, name: str, address: str) -> dict[str, str]:
    """The job's name and its replicas' nodes, for a batch script's Slurm variables (scheduling/jobfiles/slurm.py):
    YARD_NODELIST, the node names in rank order in Slurm's compressed form (SLURM_JOB_NODELIST), and
    YARD_NODE_ADDRS, "name=address" for each, the address the portal has for it (MASTER_ADDR's kind), so
    `scontrol show hostnames` can give a name that does not resolve here as its address."""
    given = [n for n in spec.get("nodes") or () if isinstance(n, list | tuple) and len(n) == 2]
    nodes = [(str(n[0]), str(n[1] or n[0])) for n in given] or [(name, address or name)]
    return {
        "YARD_JOB_NAME": str(spec.get("job_name") or ""),
        "YARD_NODELIST": hostlist.compress(n for n, _ in nodes),
        "YARD_NODE_ADDRS": " ".join(f"{n}={a}" for n, a in dict(nodes).items()),
    }


def read_fence_marker(record: TaskRecord) -> dict[str, Any] | None:
    """What the watchdog wrote when it stopped the task ({"reason", "sigterm_at", "sigkill_at"}), or None."""
    try:
        data = json.loads(record.fenced_marker.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else {}


# A launch that fails for one of these is the node's fault, not the job's: the job is requeued.
_NODE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO})


def node_fault(exc: OSError) -> str | None:
    """``"node_fault"`` for an error of the node's disk, else None (the job's own fault)."""
    return "node_fault" if exc.errno in _NODE_ERRNOS else None


def spec_key(spec: dict[str, Any]) -> tuple[int, int]:
    return int(spec["task_id"]), int(spec["attempt"])


def grace(value: Any, *, default: float) -> float:
    """The spec's grace period (0 is a valid one), as the portal ordered it (bounded against nonsense).

    A long grace cannot break the liveness arithmetic: while the portal answers it knows the task is
    stopping, and once the agent loses it stopping.check_liveness cuts every grace to max_grace_s.
    """
    return min(default if value is None else max(0.0, float(value)), MAX_ORDERED_GRACE_S)


class RequestStop(Protocol):
    """Stopper.request_stop: SIGTERM now, SIGKILL after `grace_s`."""

    def __call__(self, record: TaskRecord, *, cause: str, grace_s: float, reason: str | None) -> None: ...


class Workloads:
    """Starts tasks as process groups and follows them to their end. What it asks of the other parts
    comes in as callables: the Stopper's `request_stop` (a time limit) and `escalate` (a stopping task
    still alive), the Heartbeats' `heartbeat_soon` (a start or an end the portal should hear of), and
    the watchdog's `ensure_watchdog` (running before any workload is)."""

    def __init__(
        self,
        node: Node,
        *,
        request_stop: RequestStop,
        escalate: Callable[[TaskRecord, float], None],
        heartbeat_soon: Callable[[], None],
        ensure_watchdog: Callable[[], object],
    ) -> None:
        self.node = node
        self.request_stop = request_stop
        self.escalate = escalate
        self.heartbeat_soon = heartbeat_soon
        self.ensure_watchdog = ensure_watchdog
        self.children: dict[TaskKey, subprocess.Popen[bytes]] = {}
        # How tasks are held to their cores and memory (cgroup v2, else CPU affinity), decided once.
        self.limiter = cgroups.Limiter.for_node(log=node.log)
        self.use = cgroups.UseMeter()
        # Tasks in containers (nodeagent/containers/): the runtime and image cache, and the pulls under way.
        self.containers = Containers.for_node(node)
        self.waiting: dict[TaskKey, Waiting] = {}
        # Service replicas (nodeagent/service.py): rank 0's probes, and each container task's image, kept
        # for its restarts in place.
        self.probers = Probers()
        self.images: dict[TaskKey, Image] = {}
        # Dev sessions (nodeagent/devsession.py): their SSH connections and sessions' processes.
        self.dev = devsession.DevSessions()

    def measure_use(self) -> dict[TaskKey, cgroups.TaskUse]:
        """The real CPU and memory use of each live task (cgroups.UseMeter: one pass over /proc for all of them at most)."""
        live = [(r.key, r.pid, self.limiter.group_of(r.key)) for r in self.node.records.values() if r.live and r.pid]
        return self.use.measure(live)

    # -- launching -------------------------------------------------------------------------------------
    def checkpoint_dir(self, spec: dict[str, Any]) -> Path:
        raw = spec.get("checkpoint_dir")
        path = Path(str(raw)) if raw else Path(f"job-{spec['job_id']}")
        return path if path.is_absolute() else self.node.state_dir / "checkpoints" / path

    def open_task_dirs(self) -> None:
        """Task owners must be able to reach their working directories (search permission on every
        directory above them), and nothing more: the tasks and checkpoints folders are mode 0711."""
        state_dir = self.node.state_dir
        folder = launcher.closed_to_others(state_dir)
        if folder is not None:
            raise AgentFatal(
                f"--run-as-owner: task owners cannot reach {state_dir}, because {folder} is mode "
                f"{folder.stat().st_mode & 0o777:o}; give it o+x (chmod o+x {folder}) or choose another --state-dir"
            )
        for name in ("tasks", "checkpoints"):
            (state_dir / name).mkdir(exist_ok=True)
            (state_dir / name).chmod(0o711)
        if launcher.closed_to_others(Path(sys.executable)) is not None:
            self.node.log.warning(
                "--run-as-owner: notebooks will fail: task owners cannot run this agent's Python (%s)", sys.executable
            )

    def owner_account(self, spec: dict[str, Any]) -> tuple[pwd.struct_passwd | None, str]:
        """The local account of the task's owner, or None and what to do about it."""
        owner = str(spec.get("user") or "")
        if not owner:
            return None, "the portal sent no owner for this task, and this agent runs tasks as their owners (--run-as-owner)"
        try:
            account = pwd.getpwnam(owner)
        except KeyError:
            return None, (
                f"the job's owner {owner!r} has no local account on node {self.node.config.name}: add the account "
                "(LDAP/SSSD or useradd), or run the agent without --run-as-owner"
            )
        if account.pw_uid == 0:
            return None, f"refusing to run a task as root (owner {owner!r} maps to uid 0)"
        return account, ""

    def hand_over(self, record: TaskRecord, account: pwd.struct_passwd) -> None:
        """The owner gets its working directory and checkpoint directory (mode 0700: other accounts on
        the node read neither) and the (simulated) utilisation file; the task directory itself, with
        the log (0600: the task writes it through the descriptor it inherits) and the exit status,
        stays the agent's."""
        Path(record.workdir).chmod(0o711)
        record.log_path.touch(mode=0o600)
        record.log_path.chmod(0o600)
        record.run_dir.mkdir(mode=0o700, exist_ok=True)
        ids = (account.pw_uid, account.pw_gid)
        if self.node.gpus.simulated:
            record.util_file.touch()
            os.chown(record.util_file, *ids)
        for path in (record.run_dir, Path(record.checkpoint_dir)):
            os.chown(path, *ids)
            path.chmod(0o700)

    def task_env(
        self,
        spec: dict[str, Any],
        record: TaskRecord,
        account: pwd.struct_passwd | None = None,
        *,
        base: Mapping[str, str] = os.environ,
    ) -> dict[str, str]:
        """The task's variables over `base` (the agent's own for a host task; none in a container, where
        the image's come first)."""
        config = self.node.config
        gpus = [int(i) for i in spec.get("gpus") or []]
        env = {**base, **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}
        if account is not None:
            env.update({"HOME": account.pw_dir, "USER": account.pw_name, "LOGNAME": account.pw_name})
        # The agent's variables win over the spec's: a task must not widen its own GPUs.
        # CUDA selects a MIG instance only by its UUID ("MIG-…"); when a task holds any, every device
        # is named by UUID (a whole GPU's "GPU-…" is as good as its index), else by index as before.
        by_index = {gpu.index: gpu for gpu in self.node.gpus.gpus()}
        mig = any(i in by_index and by_index[i].mig_profile for i in gpus)
        visible = [by_index[i].uuid if mig and i in by_index else str(i) for i in gpus]
        env.update(
            {
                "CUDA_VISIBLE_DEVICES": ",".join(visible),
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "MASTER_ADDR": str(spec.get("master_addr") or config.address),
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
        env.update(gang_env(spec, name=config.name, address=str(config.address)))
        if record.service is not None:
            env.update(service.service_env(record.service.port))
        if self.node.gpus.simulated:
            env["YARD_SIM_UTIL_FILE"] = str(record.util_file)
        if spec.get("container"):
            env = container_env(env, gpus=gpus, by_uuid=mig)
        return env

    def launch(self, spec: dict[str, Any]) -> None:
        node = self.node
        task_id, attempt = spec_key(spec)
        workdir = node.state_dir / "tasks" / f"{task_id}-{attempt}"
        time_limit = spec.get("time_limit_s")
        record = TaskRecord(
            task_id=task_id,
            attempt=attempt,
            job_id=int(spec["job_id"]),
            kind=str(spec.get("kind") or "batch"),
            launch_id=uuid.uuid4().hex,
            workdir=str(workdir),
            checkpoint_dir=str(self.checkpoint_dir(spec)),
            time_limit_s=float(time_limit) if time_limit else None,
            grace_s=grace(spec.get("grace_s"), default=DEFAULT_GRACE_S),
            gpus=[int(i) for i in spec.get("gpus") or []],
        )
        if record.kind == "service" and isinstance(spec.get("service"), dict):
            port = int(spec.get("master_port") or 0)
            record.service = ServiceInfo(
                port=port,
                url=service.service_url(str(node.config.address), port),
                rank=int(spec.get("rank") or 0),
                probe=dict(spec["service"]),
                spec=service.strip_secrets(spec),
            )
        command = str(spec.get("command") or "")
        container = spec.get("container") if isinstance(spec.get("container"), dict) else None
        problem = node.disk.problem()
        if problem is not None:
            # It could not be recorded (or soon not): refused before anything starts, and requeued.
            self.launch_failed(record, f"node {node.config.name} takes no new work: {problem}", cause="node_fault")
            return
        unknown = sorted(set(record.gpus) - {gpu.index for gpu in node.gpus.gpus()})
        if unknown:
            self.launch_failed(record, f"this node has no GPU {unknown}")
            return
        account: pwd.struct_passwd | None = None
        if node.config.run_as_owner:
            account, problem = self.owner_account(spec)
            if account is None:
                self.launch_failed(record, problem)
                return
            record.run_as = account.pw_name
        try:
            workdir.mkdir(parents=True, exist_ok=True)
            Path(record.checkpoint_dir).mkdir(parents=True, exist_ok=True)
            if account is not None:
                self.hand_over(record, account)
            env = self.task_env(spec, record, account, base={} if container else os.environ)
            if record.kind == "notebook":
                closed = launcher.closed_to_others(Path(sys.executable)) if account is not None and not container else None
                if closed is not None:
                    self.launch_failed(
                        record,
                        f"a notebook runs this agent's Python ({sys.executable}) as its owner, but {closed} is closed "
                        "to other users: install the agent where every account can run it (e.g. /opt/yard-agent)",
                    )
                    return
                record.notebook = notebook.plan_notebook(address=node.config.address, env=env)
                if container:
                    # The image's Jupyter on the host's network: it binds the planned address and port as a host one.
                    command = notebook.image_notebook_command(
                        record.notebook, address=node.config.address, root_dir=record.run_dir, allow_root=account is None
                    )
                else:
                    command = notebook.notebook_command(record.notebook, address=node.config.address, root_dir=record.run_dir)
                # Jupyter's runtime files (kernel connection files) per task, whatever the owner's home.
                env["JUPYTER_RUNTIME_DIR"] = str(record.run_dir / ".jupyter-runtime")
            if record.kind == "dev":
                try:
                    # The logins get the task's own variables, not the agent's environment.
                    record.dev, command = devsession.prepare(
                        spec=spec,
                        workdir=workdir,
                        address=str(node.config.address),
                        env=self.task_env(spec, record, account, base={}),
                        account=account,
                        log=node.log,
                        image=container is not None,
                    )
                    if container is not None:
                        # The image's sshd on the host's network, its folder (host key, keys, config) at its host path.
                        folder = {"source": record.dev.dir, "target": record.dev.dir, "readonly": False}
                        container = {**container, "mounts": [*(container.get("mounts") or []), folder]}
                except (devsession.DevError, subprocess.SubprocessError) as exc:
                    self.launch_failed(record, str(exc))
                    return
        except OSError as exc:
            self.launch_failed(record, f"cannot prepare the task: {exc}", cause=node_fault(exc))
            return
        if container is not None:
            record.container = {"image": str(container.get("image") or "")}  # journaled: a restart knows it pulled
        # The watchdog must be there before the workload: it is what stops it should this agent die.
        self.ensure_watchdog()
        # Journal first: should the agent die right after the fork, the restarted agent finds the
        # process by its launch id instead of starting it a second time.
        node.records[record.key] = record
        if not node.save():
            # Unrecorded, a process could be started twice by a restarted agent: none is started.
            problem = node.disk.problem()
            self.launch_failed(record, f"node {node.config.name} cannot record the launch: {problem}", cause="node_fault")
            return
        limits = cgroups.Limits.from_spec(spec)
        if container is not None:
            # The pull runs off this loop (a launch runs inside the heartbeat); supervise starts the task.
            problem = self.containers.begin_pull(record, container)
            if problem is not None:
                self.launch_failed(record, problem, cause="image_pull")
                return
            self.waiting[record.key] = Waiting(container, command, env, account, limits)
            node.log.info("task %s attempt %s: pulling %s", task_id, attempt, container.get("image"))
            return
        self.start(record, command=command, env=env, account=account, limits=limits)

    def start_pulled(self) -> None:
        """Start the container tasks whose image has come (or end them with the pull's reason)."""
        for key, waiting in list(self.waiting.items()):
            done, image, error = self.containers.pulled(key)
            if not done:
                continue
            del self.waiting[key]
            record = self.node.records.get(key)
            if record is None or record.state != "launching" or record.pid is not None:
                continue  # stopped (or fenced) while it waited: it ended as one that never started
            if image is None:
                self.launch_failed(record, error or "image pull failed", cause="image_pull")
                continue
            record.container = {**(record.container or {}), "digest": image.digest}
            how = f"pulled in {image.pulled_s:.1f} s" if image.pulled_s else "cached"
            self.node.log.info("task %s attempt %s: image %s (%s, %s)", *key, record.container["image"], image.digest, how)
            self.start(
                record,
                command=waiting.command,
                env=waiting.env,
                account=waiting.account,
                limits=waiting.limits,
                container=waiting.container,
                image=image,
            )

    def start(
        self,
        record: TaskRecord,
        *,
        command: str,
        env: dict[str, str],
        account: pwd.struct_passwd | None,
        limits: cgroups.Limits,
        container: dict[str, Any] | None = None,
        image: Image | None = None,
        restart: bool = False,
    ) -> None:
        """Fork the task's wrapper, hold it to its limits, and let it start the workload (on the host,
        or its runtime running its container). ``restart``: a service's process started again in place
        (the task keeps its first start time, the one the portal recorded)."""
        node = self.node
        task_id, attempt = record.key
        plan: ContainerPlan | None = None
        owner = (account.pw_uid, account.pw_gid) if account is not None else None
        wrapper_env = env
        if container is not None and image is not None and self.containers.runtime is not None:
            try:
                plan = self.containers.plan(record, container, image, command=command, env=env, account=account)
            except (OSError, ValueError) as exc:  # a mount the node lacks: the job's, like a bad command
                self.launch_failed(record, f"cannot prepare the container: {exc}")
                return
            runtime = self.containers.runtime
            record.container = {**(record.container or {}), **runtime.ref(plan.container_id)}
            # The wrapper (root) runs the runtime; the container itself switches to the owner.
            command, owner = shlex.join(runtime.run_argv(plan)), None
            wrapper_env = {**os.environ, "YARD_LAUNCH_ID": record.launch_id}
            node.save()
        try:
            child = launcher.spawn(
                command=command,
                env=wrapper_env,
                cwd=record.run_dir,
                log_path=record.log_path,
                exit_file=record.exit_file,
                owner=owner,
                hold=limits.any or plan is not None,
            )
        except OSError as exc:
            self.launch_failed(record, f"cannot start the task: {exc}", cause=node_fault(exc))
            return
        try:
            others = [r.pid for r in node.records.values() if r.live and r.pid is not None and r.key != record.key]
            held = self.limiter.apply(record.key, child.pid, limits, others=others)
            if plan is not None:
                assert self.containers.runtime is not None
                self.containers.hold(plan, record.key, child.pid, self.limiter)
                held += f", {self.containers.runtime.prepare(plan)}"
        except (OSError, CdiError, subprocess.SubprocessError) as exc:
            # The wrapper waits on its stdin: killed there, it never ran anything.
            launcher.signal_group(child.pid, signal.SIGKILL)
            child.wait()
            self.launch_failed(
                record, f"cannot prepare the container: {exc}", cause=node_fault(exc) if isinstance(exc, OSError) else None
            )
            return
        except Exception:
            # The process runs already: a bug in limiting must not leave it started and unrecorded.
            node.log.exception("task %s attempt %s: limiting it failed: it runs unlimited", task_id, attempt)
            held = "unlimited"
        finally:
            launcher.release(child)  # limited or not, the workload starts now
        self.children[record.key] = child
        record.pid = child.pid
        record.start_ticks = launcher.start_ticks(child.pid)
        now = node.clock()
        if not restart or record.started_at is None:
            record.started_at = now
        record.state = "running"
        if image is not None:
            self.images[record.key] = image
        if record.service is not None:
            record.service.run_started_at = now
            record.service.restart_at = None
            if restart:
                record.service.last_restart_at = now
            self.start_probes(record)
        node.save()
        self.heartbeat_soon()  # the portal records the start with the next heartbeat
        node.log.info("started task %s attempt %s (pid %s) on GPUs %s, %s", task_id, attempt, child.pid, record.gpus, held)

    def launch_failed(self, record: TaskRecord, message: str, *, cause: str | None = None) -> None:
        """The failure goes into the task's log, so the user sees it in the portal. ``cause`` "node_fault":
        the node could not run it (its disk), and the portal requeues the job instead of failing it."""
        node = self.node
        node.log.error("task %s attempt %s: %s", record.task_id, record.attempt, message)
        record.stop_cause = cause
        record.message = message[:1000]
        node.records[record.key] = record
        try:
            Path(record.workdir).mkdir(parents=True, exist_ok=True)
            with open(record.log_path, "a") as handle:
                handle.write(f"yard-agent: {message}\n")
        except OSError:
            pass
        if record.started_at is None:  # a service that could not be started again keeps its first start
            record.started_at = node.clock()
        self.finish(record, None)
        self.heartbeat_soon()

    # -- supervision -----------------------------------------------------------------------------------
    def leader_status(self, record: TaskRecord) -> tuple[bool, int | None]:
        """(has the leader exited, its status if known)."""
        child = self.children.get(record.key)
        if child is not None:
            status = child.poll()
            return status is not None, status
        assert record.pid is not None
        if launcher.process_alive(record.pid, record.start_ticks):
            return False, None
        return True, launcher.read_exit_file(record.exit_file)

    def supervise(self) -> None:
        node = self.node
        self.start_pulled()
        self.follow_probes()
        self.restart_due()
        for record in list(node.records.values()):
            if record.pid is None or record.state not in ("running", "stopping"):
                continue
            exited, status = self.leader_status(record)
            now = node.clock()
            if record.state == "running":
                if exited:
                    # Whatever the workload left behind in its group (or its container) goes with it.
                    signal_task(record.container, record.pid, signal.SIGKILL)
                    if not self.restart_later(record, status):
                        self.finish(record, status)
                elif record.time_limit_s and record.started_at and now - record.started_at > record.time_limit_s:
                    self.request_stop(record, cause="time_limit", grace_s=record.grace_s, reason="time limit")
                continue
            if exited and not launcher.group_alive(record.pid):
                self.finish(record, status)
            else:
                self.escalate(record, now)
        self.limiter.sweep()

    def finish(self, record: TaskRecord, status: int | None) -> None:
        node = self.node
        if record.stop_cause is None and (fenced := read_fence_marker(record)) is not None:
            # The node's watchdog stopped it while no agent was watching: its agent was gone too long.
            record.stop_cause = "agent_lost"
            record.sigterm_at = fenced.get("sigterm_at") or node.clock()
            record.sigkill_at = fenced.get("sigkill_at")
        exit_code, signum = launcher.decode_status(status)
        if status is None and record.sigkill_at is not None:
            signum = int(signal.SIGKILL)  # killed wrapper and all: it could not record a status
        record.exit_code, record.signal = exit_code, signum
        if record.sigterm_at is not None:
            record.stopped_by = "sigkill" if record.sigkill_at is not None else "sigterm"
        record.state = "exited"
        record.ended_at = node.clock()
        self.children.pop(record.key, None)
        self.probers.stop(record.key)
        self.images.pop(record.key, None)
        if record.dev is not None:
            # What is left of its SSH sessions (they are not in its process group) goes with it.
            self.dev.signal(record.key, None, None, signal.SIGKILL)
            self.dev.forget(record.key)
        if record.service is not None:
            record.service.restart_at = None  # ended while it waited to start again: never started again
        if record.container:
            self.containers.cleanup(record)  # before its cgroup goes: runc's own group is below it
        if (note := self.limiter.release(record.key)) is not None:
            node.log.warning("task %s attempt %s: %s", record.task_id, record.attempt, note)
            with contextlib.suppress(OSError), open(record.log_path, "a") as handle:
                handle.write(note + "\n")
        node.save()
        self.heartbeat_soon()
        node.log.info(
            "task %s attempt %s ended: exit %s signal %s stopped_by %s",
            record.task_id,
            record.attempt,
            exit_code,
            signum,
            record.stopped_by,
        )

    # -- service replicas: probes and restarts in place (docs/services.md, nodeagent/service.py) ------------
    def start_probes(self, record: TaskRecord) -> None:
        """Probe the process just started (or adopted) of a service's rank 0, in a thread of its own.
        Its liveness probe kills exactly this process (pid and start time, or its container): never a
        later one, nor a process that took the pid after it."""
        info = record.service
        if info is None or not info.probed or info.port <= 0 or record.pid is None:
            return
        pid, ticks = record.pid, record.start_ticks
        ref = dict(record.container) if record.container else None
        log = self.node.log

        def kill(reason: str) -> None:
            if launcher.process_alive(pid, ticks):
                log.warning("task %s attempt %s: %s", record.task_id, record.attempt, reason)
                signal_task(ref, pid, signal.SIGKILL)

        def changed() -> None:
            # The portal's proxy and controller act on readiness: it goes out with the next heartbeat, soon.
            current = self.probers.get(record.key)
            if current is not None and current.killed is None:
                log.info(
                    "task %s attempt %s: %s", record.task_id, record.attempt, "ready" if current.snapshot()[0] else "not ready"
                )
            self.heartbeat_soon()

        prober = Prober(
            address=str(self.node.config.address),
            port=info.port,
            spec=info.probe_spec(),
            on_change=changed,
            kill=kill,
            name=f"probe-{record.task_id}-{record.attempt}",
        )
        self.probers.start(record.key, prober)

    def follow_probes(self) -> None:
        """Stop the probes of tasks no longer running (stopping, ended, forgotten); a replica that has
        been ready since its last crash is no longer crash-looping (journaled here, on the loop)."""
        for key in self.probers.tasks():
            record = self.node.records.get(key)
            prober = self.probers.get(key)
            if record is None or record.state != "running" or record.pid is None or prober is None:
                self.probers.stop(key)
                continue
            if record.service is not None and record.service.crashes_since_ready and prober.snapshot()[2]:
                record.service.crashes_since_ready = 0  # its message still tells of its last restart
                self.node.dirty = True

    def service_report(self, record: TaskRecord) -> dict[str, Any] | None:
        """The heartbeat's ``service`` object for a service task (None for any other)."""
        if record.service is None:
            return None
        running = record.state == "running" and record.pid is not None
        return service.report(record.service, self.probers.get(record.key), running=running)

    # -- dev sessions: sshd's report, its keys, its sessions' end (docs/dev-sessions.md, nodeagent/devsession.py) --
    def dev_report(self, record: TaskRecord) -> dict[str, Any] | None:
        """The heartbeat's ``dev`` object for a dev task while it is live (None for any other)."""
        if record.dev is None or not record.live:
            return None
        running = record.state == "running" and record.pid is not None
        return self.dev.report(
            record.key, record.dev, pid=record.pid, ticks=record.start_ticks, running=running, now=self.node.clock()
        )

    def dev_keys(self, record: TaskRecord, spec: dict[str, Any]) -> None:
        """authorized_keys as the spec says now: sshd reads it at each login, so no restart is needed."""
        info = record.dev
        assert info is not None
        if not isinstance(spec.get("dev"), dict):
            return  # an entry without its keys says nothing about them: they stay as they are
        keys = devsession.clean_keys(spec)
        if keys == info.keys:
            return
        try:
            devsession.write_keys(info, keys)
        except OSError as exc:
            self.node.log.error("task %s attempt %s: cannot update its SSH keys: %s", *record.key, exc)
            return
        self.node.dirty = True
        self.node.log.info("task %s attempt %s: SSH keys updated (%d key(s))", *record.key, len(keys))

    def signal_sessions(self, record: TaskRecord, signum: signal.Signals) -> None:
        """A dev task's SSH sessions get the signal its process group gets (each left the group: setsid)."""
        if record.dev is not None:
            self.dev.signal(record.key, record.pid, record.start_ticks, signum)

    def restart_later(self, record: TaskRecord, status: int | None) -> bool:
        """A service's process exited while nobody told it to stop: count the crash, write it into the
        task's log, and schedule its start again after the back-off (restart_due does it). False when
        the task ends instead: not a service, or it was being stopped, or the watchdog fenced it."""
        info = record.service
        node = self.node
        if info is None or record.state != "running" or record.pid is None:
            return False
        if record.stop_cause is not None or record.sigterm_at is not None or read_fence_marker(record) is not None:
            return False
        signal_task(record.container, record.pid, signal.SIGKILL)  # what is left of this process goes
        prober = self.probers.stop(record.key)
        killed = prober.killed if prober is not None else None
        ever_ready = prober.snapshot()[2] if prober is not None else False
        exit_code, signum = launcher.decode_status(status)
        code = exit_code if exit_code is not None else (-signum if signum is not None else None)
        line = info.crashed(now=node.clock(), exit_code=code, ever_ready=ever_ready)
        if record.container:
            # The dead container goes (before its cgroup: runc's own group is below it); its image stays
            # (its digest keeps it from eviction), for the next one.
            self.containers.cleanup(record)
            record.container = {k: v for k, v in record.container.items() if k in ("image", "digest")}
        # Its cgroup goes too (whatever escaped the process group with it), and says whether the kernel
        # killed the server for its memory; the next process gets a fresh one.
        oom = self.limiter.release(record.key)
        cause = "; ".join(c.removeprefix("yard-agent: ") for c in (killed, oom) if c)
        info.message = service.clip_message(f"{cause}; {line}" if cause else line)
        self.children.pop(record.key, None)
        with contextlib.suppress(OSError):
            record.exit_file.unlink(missing_ok=True)  # the next process's status must not be read as this one's
        with contextlib.suppress(OSError), open(record.log_path, "a") as handle:
            if killed:
                handle.write(f"yard-agent: {killed}\n")
            if oom:
                handle.write(f"{oom}\n")
            handle.write(f"yard-agent: {line}\n")
        record.pid = None
        record.start_ticks = None
        # The next process's launch id, journaled before it is forked: a restarted agent finds it by it.
        record.launch_id = uuid.uuid4().hex
        node.save()
        self.heartbeat_soon()
        node.log.warning("task %s attempt %s: %s", record.task_id, record.attempt, info.message)
        return True

    def restart_due(self) -> None:
        """Start again the services whose back-off is over."""
        node = self.node
        if node.link.lost or node.link.silence() > node.config.stop_after_s:
            # Cut off from the portal as long as it takes to give the job up (it may start the next attempt
            # elsewhere once the watchdog's bound has passed): nothing new starts here. check_liveness ends
            # these tasks (a stop during the back-off), and a heartbeat accepted again lets them restart.
            return
        now = node.clock()
        for record in list(self.node.records.values()):
            info = record.service
            if info is None or record.state != "running" or record.pid is not None:
                continue
            if info.restart_at is not None and now >= info.restart_at:
                self.restart(record)

    def restart(self, record: TaskRecord) -> None:
        """Start a service's process again, on the same GPUs, with the command, environment and limits
        rebuilt from its journaled spec (so a restarted agent can do it too), under a fresh launch id."""
        info = record.service
        assert info is not None
        node = self.node
        spec = info.spec
        account: pwd.struct_passwd | None = None
        if record.run_as:
            try:
                account = pwd.getpwnam(record.run_as)
            except KeyError:
                self.launch_failed(record, f"cannot restart the service: its owner {record.run_as!r} has no local account here")
                return
        container = spec.get("container") if isinstance(spec.get("container"), dict) else None
        image: Image | None = None
        if container is not None:
            digest = (record.container or {}).get("digest")
            image = self.images.get(record.key) or (self.containers.cache.cached(str(digest)) if digest else None)
            if image is None:
                # Only after an agent restart that lost the image from the cache (nothing else evicts a live task's).
                gone = f"its image {container.get('image')} is gone from this node's cache"
                self.launch_failed(record, f"cannot restart the service: {gone}")
                return
        problem = node.disk.problem()
        if problem is not None:
            self.launch_failed(record, f"cannot restart the service: node {node.config.name}: {problem}", cause="node_fault")
            return
        try:
            env = self.task_env(spec, record, account, base={} if container else os.environ)
        except (KeyError, TypeError, ValueError) as exc:
            self.launch_failed(record, f"cannot restart the service: its journaled spec is unusable ({exc!r})")
            return
        self.ensure_watchdog()
        if not node.save():  # the new launch id first, as at any launch
            problem = f"node {node.config.name} cannot record it"
            self.launch_failed(record, f"cannot restart the service: {problem}", cause="node_fault")
            return
        node.log.info(
            "task %s attempt %s: starting it again in place (restart %s)", record.task_id, record.attempt, info.restarts
        )
        self.start(
            record,
            command=str(spec.get("command") or ""),
            env=env,
            account=account,
            limits=cgroups.Limits.from_spec(spec),
            container=container,
            image=image,
            restart=True,
        )
