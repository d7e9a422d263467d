"""runc: one OCI bundle per task, run in the foreground under the agent's wrapper.

Checked on cgroup v1 hybrid Debian 12 as root: runc refuses a config with ``process.rlimits`` there,
so the bundle has none (the container keeps the wrapper's limits). What the bundle holds:

- the image's shared, read-only rootfs under an overlay whose upper layer is the container's own
  (removed with it); where overlayfs cannot be mounted, the shared rootfs read-only and a tmpfs on
  /tmp (and /var/tmp);
- the host's network (no network namespace: ranks rendezvous on the node's address), its own mount,
  pid, ipc and uts namespaces, /dev/shm a tmpfs the size the kernel allows (NCCL's shared memory);
- the task's GPUs: their device nodes and those of the driver, allowed in the device cgroup, or what
  the node's CDI spec says for them (cdi.py);
- bind mounts the caller plans (run dir, checkpoint dir, simulated GPU file, the user's mounts), the
  host's /etc/hosts and /etc/resolv.conf read-only;
- the owner's uid, gid and groups with no capabilities, or root with Docker's default set.

``runc run`` removes a container whose init has ended; ``delete`` removes what a killed runc left.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from nodeagent.containers import cdi
from nodeagent.containers.base import RUNC, ContainerPlan, Runtime

CALL_TIMEOUT_S = 20.0
REMOVE_WAIT_S = 5.0
# Docker's default capabilities for a container's root.
ROOT_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]
MASKED = [
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/sched_debug",
    "/sys/firmware",
]
READONLY = ["/proc/asound", "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]
HOST_FILES = ("/etc/hosts", "/etc/resolv.conf")
# The device cgroup denies all but these (runc creates their nodes) and the task's GPUs: null, zero,
# full, random, urandom, tty, ptmx and the pseudo-terminals, as Docker allows.
DEFAULT_DEVICES: list[tuple[int, int | None]] = [(1, 3), (1, 5), (1, 7), (1, 8), (1, 9), (5, 0), (5, 2), (136, None)]


def _bind(source: str, target: str, *, readonly: bool) -> dict[str, Any]:
    return {"destination": target, "type": "bind", "source": source, "options": ["rbind", "ro" if readonly else "rw"]}


def _tmpfs(target: str, *options: str) -> dict[str, Any]:
    return {"destination": target, "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", *options]}


def base_mounts() -> list[dict[str, Any]]:
    return [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        _tmpfs("/dev", "strictatime", "mode=755", "size=65536k"),
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        _tmpfs("/dev/shm", "nodev", "mode=1777"),
        {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
    ]


def bundle_config(plan: ContainerPlan, *, root: Path, readonly: bool, edits: cdi.Edits | None = None) -> dict[str, Any]:
    """The config.json of `plan`'s container, its root at `root` (an overlay, or the shared rootfs read-only)."""
    edits = edits or cdi.Edits()
    mounts = base_mounts()
    if readonly:
        mounts += [_tmpfs("/tmp", "nodev", "mode=1777"), _tmpfs("/var/tmp", "nodev", "mode=1777")]
    mounts += [_bind(f, f, readonly=True) for f in HOST_FILES if Path(f).is_file()]
    mounts += [_bind(m.source, m.target, readonly=m.readonly) for m in plan.mounts]
    for extra in edits.mounts:
        mounts.append(
            {
                "destination": str(extra["containerPath"]),
                "type": str(extra.get("type") or "bind"),
                "source": str(extra.get("hostPath") or extra["containerPath"]),
                "options": [str(o) for o in extra.get("options") or ["rbind", "ro"]],
            }
        )
    devices: dict[str, dict[str, Any]] = {}
    for path in cdi.nvidia_nodes(plan.gpus):
        if (entry := cdi.device_entry(path)) is not None:
            devices[path] = entry
    for node in edits.device_nodes:
        if (entry := cdi.device_entry(str(node["path"]), node.get("hostPath"))) is not None:
            devices[entry["path"]] = entry
    pairs = DEFAULT_DEVICES + [(d["major"], d["minor"]) for d in devices.values()]
    allowed: list[dict[str, Any]] = [{"allow": False, "access": "rwm"}]
    for major, minor in pairs:  # no minor: all of the major's
        allowed.append(
            {"allow": True, "type": "c", "major": major, "access": "rwm", **({} if minor is None else {"minor": minor})}
        )
    env = {**dict(_pair(e) for e in plan.image.env), **dict(_pair(e) for e in edits.env), **plan.env}
    caps = ROOT_CAPS if plan.uid == 0 else []
    hooks: dict[str, list[dict[str, Any]]] = {}
    for hook in edits.hooks:
        entry = {"path": str(hook["path"]), "args": [str(a) for a in hook.get("args") or []]}
        if hook.get("env"):
            entry["env"] = [str(e) for e in hook["env"]]
        hooks.setdefault(str(hook["hookName"]), []).append(entry)
    linux: dict[str, Any] = {
        # No network namespace: the host's network, for rendezvous between ranks on the node's address.
        "namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount")],
        "devices": list(devices.values()),
        "resources": {"devices": allowed, **({"cpu": {"cpus": ",".join(map(str, plan.cpus))}} if plan.cpus else {})},
        "maskedPaths": MASKED,
        "readonlyPaths": READONLY,
    }
    if plan.cgroups_path:
        linux["cgroupsPath"] = plan.cgroups_path
    config: dict[str, Any] = {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": plan.uid, "gid": plan.gid, **({"additionalGids": plan.groups} if plan.groups else {})},
            "args": plan.args,
            "env": [f"{k}={v}" for k, v in env.items()],
            "cwd": plan.cwd,
            "capabilities": {k: caps for k in ("bounding", "effective", "permitted")},
            "noNewPrivileges": True,
            # No "rlimits": runc cannot set them on these nodes; the container keeps the wrapper's.
        },
        "root": {"path": str(root), "readonly": readonly},
        "hostname": plan.hostname,
        "mounts": mounts,
        "linux": linux,
    }
    if hooks:
        config["hooks"] = hooks
    return config


def _pair(item: str) -> tuple[str, str]:
    key, _, value = item.partition("=")
    return key, value


def _mounted(path: Path) -> bool:
    target = str(path)
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4].replace("\\040", " ") == target:
                return True
    return False


class Runc(Runtime):
    name = RUNC

    def __init__(self, *, binary: str, root: Path, cdi_paths: tuple[Path, ...] = cdi.SPEC_PATHS) -> None:
        self.binary = binary
        self.root = root
        self.cdi_paths = cdi_paths

    def _runc(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [self.binary, "--root", str(self.root), *args],
            capture_output=True,
            text=True,
            timeout=CALL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )

    def prepare(self, plan: ContainerPlan) -> str:
        """The bundle, its root an overlay of the shared rootfs where the kernel allows one."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        bundle = plan.bundle
        bundle.mkdir(parents=True, exist_ok=True, mode=0o700)
        root, readonly, note = self._overlay(plan)
        spec_path = cdi.find_spec(self.cdi_paths) if plan.gpus else None
        edits = cdi.edits_for(cdi.load(spec_path), plan.gpus) if spec_path is not None else None
        if spec_path is not None:
            note += f", GPUs as {spec_path} says"
        config = bundle_config(plan, root=root, readonly=readonly, edits=edits)
        (bundle / "config.json").write_text(json.dumps(config, indent=1))
        return note

    def _overlay(self, plan: ContainerPlan) -> tuple[Path, bool, str]:
        upper, work, merged = plan.bundle / "upper", plan.bundle / "work", plan.bundle / "rootfs"
        for folder in (upper, work, merged):
            folder.mkdir(exist_ok=True)
        if _mounted(merged):
            return merged, False, "writable overlay"
        options = f"lowerdir={plan.rootfs},upperdir={upper},workdir={work}"
        done = subprocess.run(
            ["mount", "-t", "overlay", "overlay", "-o", options, str(merged)],
            capture_output=True,
            text=True,
            timeout=CALL_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
        )
        if done.returncode == 0:
            return merged, False, "writable overlay"
        why = (done.stderr.strip() or f"mount exited {done.returncode}").splitlines()[-1]
        return plan.rootfs, True, f"read-only root with tmpfs /tmp (no overlay: {why})"

    def run_argv(self, plan: ContainerPlan) -> list[str]:
        # --no-new-keyring: the session keyring is the wrapper's, not one per container (the kernel's
        # keyring quota is small).
        return [self.binary, "--root", str(self.root), "run", "--no-new-keyring", "--bundle", str(plan.bundle), plan.container_id]

    def signal(self, container_id: str, signum: int) -> bool:
        try:
            done = self._runc("kill", "--all", container_id, signal.Signals(signum).name.removeprefix("SIG"))
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def delete(self, container_id: str, bundle: Path | None) -> None:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            if self.state(container_id) is not None:
                self._runc("delete", "--force", container_id)
        if bundle is None:
            return
        merged = bundle / "rootfs"
        if _mounted(merged):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(
                    ["umount", "-l", str(merged)], capture_output=True, timeout=CALL_TIMEOUT_S, stdin=subprocess.DEVNULL
                )
        # The rootfs stays busy (EBUSY) while the container's mount namespace lives: its last
        # processes may still be exiting from the kill above.
        deadline = time.monotonic() + REMOVE_WAIT_S
        while not _mounted(merged):
            shutil.rmtree(bundle, ignore_errors=True)
            if not bundle.exists() or time.monotonic() > deadline:
                break
            time.sleep(0.05)

    def state(self, container_id: str) -> str | None:
        try:
            done = self._runc("state", container_id)
            return str(json.loads(done.stdout)["status"]) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
            return None

    def list(self) -> list[str]:
        try:
            done = self._runc("list", "--format", "json")
            found = json.loads(done.stdout or "null") if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return []
        return [str(c["id"]) for c in found or [] if isinstance(c, dict) and "id" in c]

    def ref(self, container_id: str) -> dict[str, Any]:
        return {"runtime": RUNC, "binary": self.binary, "root": str(self.root), "id": container_id}


def owner_groups(user: str, gid: int) -> list[int]:
    """The owner's supplementary groups, as setpriv --init-groups gives a host task."""
    with contextlib.suppress(OSError, KeyError):
        return [g for g in os.getgrouplist(user, gid) if g != gid]
    return []
