"""What a launch asks of containers: the image pulled off the agent's loop, the container planned,
and what is left of it removed when the task ends.

A launch runs inside the heartbeat (reconciliation answers it), so a pull, which may take minutes,
runs in a thread of its own: the task waits recorded as "launching" (a stop or a fence ends it at
once, as one that never started) and Workloads.supervise starts it once its image is there.
"""

from __future__ import annotations

import os
import pwd
import threading
from dataclasses import dataclass, field
from typing import Any

from nodeagent.cgroups import CGROUP_MOUNT, Limiter, Limits
from nodeagent.containers import runc as runc_mod
from nodeagent.containers.base import ContainerPlan, Mount, Runtime, container_id
from nodeagent.containers.images import Image, ImageCache, PullError
from nodeagent.containers.runtime import detect, from_ref
from nodeagent.context import Node, TaskKey
from nodeagent.journal import TaskRecord
from nodeagent.notebook import JUPYTER_CONFIG

GB = 1024**3
# The job's command runs as `/bin/sh -c <command>` under a shell that is the container's init (pid 1)
# and only waits for it: the kernel gives a pid namespace's init no signal it has no handler for, so
# a workload that were pid 1 itself would ignore SIGTERM and sit out its grace. Below it, the
# workload gets SIGTERM's default action as on the host, or its own trap; the exit status is its own.
INIT = ["/bin/sh", "-c", '/bin/sh -c "$0"; exit $?']


def _hosts(text: str) -> list[str]:
    return [h.strip() for h in text.split(",") if h.strip()]


@dataclass
class Waiting:
    """A container task waiting for its image: what its start needs once the pull is done."""

    container: dict[str, Any]
    command: str
    env: dict[str, str]
    account: pwd.struct_passwd | None
    limits: Limits


@dataclass
class _Pull:
    """One task's pull, done in a thread: its image or its error once `done` is set."""

    done: threading.Event = field(default_factory=threading.Event)
    image: Image | None = None
    error: str | None = None


class Containers:
    """The node's container runtime (None: it has none, and says why) and image cache, and the pulls
    under way, for the Workloads (nodeagent/launch.py)."""

    def __init__(self, node: Node, *, runtime: Runtime | None, why: str, cache: ImageCache) -> None:
        self.node = node
        self.runtime = runtime
        self.why = why
        self.cache = cache
        self.pulls: dict[TaskKey, _Pull] = {}

    @classmethod
    def for_node(cls, node: Node) -> Containers:
        config = node.config
        runtime, why = detect(config.container_runtime, state_dir=node.state_dir)
        (node.log.info if runtime is not None else node.log.warning)("%s", why)
        node.container_runtime = (runtime.name if runtime is not None else "", why)
        cache = ImageCache(
            root=config.image_cache or node.state_dir / "images",
            max_bytes=int(config.image_cache_gb * GB),
            allow=_hosts(config.registry_allow),
            insecure=_hosts(config.registry_insecure),
        )
        return cls(node, runtime=runtime, why=why, cache=cache)

    # -- pulling -----------------------------------------------------------------------------------
    def begin_pull(self, record: TaskRecord, container: dict[str, Any]) -> str | None:
        """Start pulling the task's image in a thread; the reason it cannot be run here, else None."""
        if self.runtime is None:
            return f"this node cannot run containers: {self.why}"
        reference = str(container.get("image") or "")
        auth = container.get("auth") if isinstance(container.get("auth"), dict) else None
        pull = self.pulls[record.key] = _Pull()

        def work() -> None:
            try:
                pull.image = self.cache.get(reference, auth=auth, in_use=self.live_digests)
            except PullError as exc:
                pull.error = str(exc)
            except Exception as exc:  # a bug must end the task with a reason, not leave it launching
                self.node.log.exception("pulling %s failed", reference)
                pull.error = f"image pull failed: {reference}: {exc.__class__.__name__}: {exc}"
            finally:
                pull.done.set()

        threading.Thread(target=work, name=f"pull-{record.task_id}-{record.attempt}", daemon=True).start()
        return None

    def pulled(self, key: TaskKey) -> tuple[bool, Image | None, str | None]:
        """(done, image, error) of the task's pull; a done one is forgotten here."""
        pull = self.pulls.get(key)
        if pull is None:
            return True, None, "image pull failed: the pull was lost (agent restarted?)"
        if not pull.done.is_set():
            return False, None, None
        del self.pulls[key]
        return True, pull.image, pull.error

    def live_digests(self) -> set[str]:
        """Images no eviction may remove: those of the tasks that are, or are about to be, running."""
        return {
            str(r.container["digest"])
            for r in list(self.node.records.values())
            if r.live and r.container and r.container.get("digest")
        }

    # -- running -----------------------------------------------------------------------------------
    def plan(
        self,
        record: TaskRecord,
        container: dict[str, Any],
        image: Image,
        *,
        command: str,
        env: dict[str, str],
        account: pwd.struct_passwd | None,
    ) -> ContainerPlan:
        """The task's container: its directories at their host paths, the user's mounts, its GPUs."""
        cid = container_id(record.launch_id)
        mounts = [Mount(str(record.run_dir), str(record.run_dir)), Mount(record.checkpoint_dir, record.checkpoint_dir)]
        if self.node.gpus.simulated:
            record.util_file.touch()
            mounts.append(Mount(str(record.util_file), str(record.util_file)))
        if record.notebook is not None:
            # JUPYTER_CONFIG_PATH names the agent's page config (no token in JupyterLab's page) at its host path.
            mounts.append(Mount(str(JUPYTER_CONFIG), str(JUPYTER_CONFIG), readonly=True))
        for item in container.get("mounts") or []:
            source, target = str(item.get("source") or ""), str(item.get("target") or item.get("source") or "")
            if not os.path.isabs(source) or not os.path.isabs(target):
                raise ValueError(f"a container mount needs absolute paths, not {source!r} -> {target!r}")
            if not os.path.exists(source):
                raise ValueError(f"the container mount's source {source} does not exist on node {self.node.config.name}")
            mounts.append(Mount(source, target, readonly=bool(item.get("readonly"))))
        args = [*INIT, command] if command else list(image.config.args)
        if not args:
            raise ValueError("the job gives no command and the image no Entrypoint or Cmd")
        uid, gid = (account.pw_uid, account.pw_gid) if account is not None else (0, 0)
        return ContainerPlan(
            container_id=cid,
            bundle=self.node.state_dir / "containers" / cid,
            rootfs=image.rootfs,
            image=image.config,
            args=args,
            env=env,
            cwd=str(container.get("workdir") or record.run_dir),
            uid=uid,
            gid=gid,
            groups=runc_mod.owner_groups(account.pw_name, gid) if account is not None else [],
            mounts=mounts,
            gpus=list(record.gpus),
            hostname=self.node.config.name,
        )

    def hold(self, plan: ContainerPlan, key: TaskKey, pid: int, limiter: Limiter) -> None:
        """Keep the container in the limits the task's wrapper (`pid`) was just given: under its cgroup
        v2 group (cpu.max and memory.max hold every group below), else on the cores it was pinned to
        (on cgroup v1, joining runc's cpuset group would reset the affinity to every core)."""
        cgroup = limiter.group_of(key)
        if cgroup is not None:
            plan.cgroups_path = f"/{cgroup.relative_to(CGROUP_MOUNT)}/ctr"
            return
        plan.cgroups_path = f"/yard/{plan.container_id}"
        cores = sorted(os.sched_getaffinity(pid))
        plan.cpus = cores if cores != limiter.cores else None

    def sweep(self) -> list[str]:
        """Remove the containers and bundles of this agent's state that no live task of its journal
        names (a journal moved away, a crash between a container's end and its cleanup)."""
        if self.runtime is None:
            return []
        live = {str(r.container.get("id")) for r in self.node.records.values() if r.live and r.container}
        bundles = self.node.state_dir / "containers"
        found = set(self.runtime.list()) | ({p.name for p in bundles.iterdir()} if bundles.is_dir() else set())
        stale = sorted(found - live)
        for cid in stale:
            self.node.log.warning("removing container %s: no live task of this agent's journal is in it", cid)
            self.runtime.delete(cid, bundles / cid)
        return stale

    def cleanup(self, record: TaskRecord) -> None:
        """Kill and remove what is left of the task's container, and its bundle."""
        found = from_ref(record.container)
        if found is None:
            return
        runtime, cid = found
        runtime.delete(cid, self.node.state_dir / "containers" / cid)


def container_env(env: dict[str, str], *, gpus: list[int], by_uuid: bool) -> dict[str, str]:
    """The task's variables as a container sees its GPUs: NVIDIA_VISIBLE_DEVICES names the host's (as
    the NVIDIA container toolkit takes them); only their device nodes are inside, and CUDA numbers
    those from 0, so CUDA_VISIBLE_DEVICES counts from 0 too (UUIDs, for MIG, stay as they are)."""
    visible = env.get("CUDA_VISIBLE_DEVICES", "")
    out = {**env, "NVIDIA_VISIBLE_DEVICES": visible if by_uuid else ",".join(str(i) for i in gpus) or "void"}
    if not by_uuid:
        out["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    return out
