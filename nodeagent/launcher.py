"""Starting, watching and stopping workload processes; no portal, no state, just the OS.

Each task runs as its own process group (a new session) under a tiny /bin/sh wrapper that writes the
workload's exit status to a file: the agent may be restarted while the workload runs, and a
restarted agent is no longer its parent, so the file is how it still learns the result.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

# The wrapper traps TERM/INT/HUP with a no-op so that, when the whole group is signalled, it outlives
# the workload long enough to record its status (a trap runs only after the foreground command ends).
# The workload itself gets default dispositions back: traps with commands are not inherited.
# The command runs under bash where there is one: `bash -c CMD` execs a simple command in place,
# so the workload itself receives SIGTERM and its own exit status is reported. Debian's /bin/sh
# (dash) forks instead, and the intermediate shell would die of the SIGTERM first (status 143)
# even when the workload traps it, checkpoints and exits 0.
# With an owner (--run-as-owner), the wrapper stays the agent's (root) and writes the status file where
# the workload cannot; only the command switches to the owner's uid, gid and groups through setpriv.
_TRAP = 'trap ":" TERM INT HUP; '
_WRAPPER = 'cmd=$1; out=$2; shift 2; "$@" -c "$cmd"; rc=$?; echo "$rc" > "$out.tmp" && mv "$out.tmp" "$out"; exit "$rc"'
# Held (spawn(hold=True)), the wrapper first waits for its stdin to close: the agent moves it into the
# task's cgroup or pins its cores meanwhile, so the workload and all it forks are born inside the
# limits (Python 3.11 cannot clone straight into a cgroup, and a pid moved after exec could fork
# first). Should the agent die in between, the pipe closes and the task runs unlimited.
_HOLD = "read -r _; exec </dev/null; "
_COMMAND_SHELL = shutil.which("bash") or "/bin/sh"
SETPRIV = shutil.which("setpriv")


def spawn(
    *,
    command: str,
    env: dict[str, str],
    cwd: Path,
    log_path: Path,
    exit_file: Path,
    owner: tuple[int, int] | None = None,
    hold: bool = False,
) -> subprocess.Popen[bytes]:
    """Start `command` in a new session, stdout and stderr appended to `log_path`; as (uid, gid) `owner`
    if given (the agent must be root, and setpriv installed). With `hold`, the wrapper waits to start
    the command until `release` (the workload itself still gets /dev/null as stdin)."""
    shell = [_COMMAND_SHELL]
    if owner is not None:
        if SETPRIV is None:
            raise OSError("setpriv (util-linux) is not installed: it is needed to run a task as its owner")
        uid, gid = owner
        shell = [SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--init-groups", "--", _COMMAND_SHELL]
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            # absolute: the wrapper runs in the task's working directory, not the agent's
            [
                "/bin/sh",
                "-c",
                _TRAP + (_HOLD if hold else "") + _WRAPPER,
                "yard-task",
                command,
                str(exit_file.absolute()),
                *shell,
            ],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE if hold else subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )


def release(child: subprocess.Popen[bytes]) -> None:
    """Let a held wrapper (spawn(hold=True)) start its workload."""
    if child.stdin is not None:
        with contextlib.suppress(OSError):
            child.stdin.close()


def closed_to_others(path: Path) -> Path | None:
    """The first of ``path`` and the folders above it that other users may not search (or, for
    ``path`` itself, execute), following links; None when every account can reach it."""
    target = path.resolve()
    for folder in (target, *target.parents):
        if not folder.stat().st_mode & 0o001:
            return folder
    return None


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on; the command name before it may hold spaces."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw[raw.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, it names one process for good."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def process_alive(pid: int, ticks: int | None) -> bool:
    """Is `pid` still the process we started (same start time), and not a zombie?"""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or int(fields[19]) == ticks


def group_alive(pgid: int) -> bool:
    """Does any live (non-zombie) process remain in the group? Zombies count as gone: orphans are
    reparented to PID 1, which in a container may never reap them."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat_fields(int(entry.name))
            if fields and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return True
    return False


def signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signum)


def find_by_launch_id(launch_id: str) -> int | None:
    """The group leader whose environment holds YARD_LAUNCH_ID=<launch_id>: finds a workload started
    just before the agent died, before the journal recorded its pid."""
    needle = f"YARD_LAUNCH_ID={launch_id}".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        fields = _stat_fields(pid)
        if needle in environ.split(b"\0") and fields and int(fields[2]) == pid:
            return pid
    return None


def read_exit_file(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def decode_status(status: int | None) -> tuple[int | None, int | None]:
    """(exit_code, signal) from a Popen returncode (negative: signal) or a shell status (>128: signal)."""
    if status is None:
        return None, None
    if status < 0:
        return None, -status
    if status > 128 and status - 128 < signal.NSIG:
        return None, status - 128
    return status, None


def free_port(address: str) -> int:
    """A TCP port free on `address` now (the kernel picks it; a small race with others is accepted)."""
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port
