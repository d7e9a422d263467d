"""Dev sessions (docs/dev-sessions.md): a real OpenSSH sshd per task, for terminals and VS Code Remote-SSH.

A dev session is launched like a notebook (nodeagent/launch.py): its GPUs, limits and owner are a task's;
its process is ``exec sshd -D -e -f <config>``. What differs is here:

- ``prepare``: in the task's directory, a folder ``sshd/`` with a host key generated for this session
  (ed25519), the owner's public keys (``authorized_keys``, 0600) and the sshd_config: it listens on the
  agent's address at the entry's ``master_port``, lets in keys only, the one login account only, and gives
  every login the task's variables (its GPUs, YARD_*, the job's env) with ``SetEnv``;
- ``write_keys``: the keys follow the portal's spec at every reconcile (sshd reads the file at each login,
  so a key added or removed takes effect without a restart);
- ``DevSessions``: the heartbeat's ``dev`` report (endpoint, host key, connections, last activity) and the
  ending of the SSH sessions with the task. sshd's sessions leave its process group (each calls setsid), so
  the Stopper's signals to the group would not reach them: every signal the task gets goes to them too.

The folder is the task's directory's (the agent's, mode 0711), not its work directory: run as its owner, a
task owns its work directory, and the agent, root there, must never write through a path the owner could
turn into a link. The folder itself is the login account's (sshd, run as the owner, reads its host key and
writes its pid file there); the agent writes into it through fresh files renamed into place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nodeagent import cgroups, launcher
from nodeagent.protocol import DEV_CONNECTIONS_MAX, DEV_ENDPOINT_MAX, DEV_HOST_KEY_MAX

NO_SSHD = "this node has no OpenSSH server (apt-get install openssh-server)"
NO_KEYGEN = "this node has no ssh-keygen (apt-get install openssh-client)"
NO_SSHD_IN_IMAGE = "a dev session's image needs OpenSSH's sshd (openssh-server)"
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/local/sbin/sshd")
KEYGEN_TIMEOUT_S = 30.0
# A public key line ("<type> <base64> [comment]") longer than this is no key (RSA 16384 is ~2.8 KB).
KEY_MAX = 16 * 1024
KEYS_MAX = 1000
# Variables of the task not given to logins: sshd sets the account's own, the rendezvous ones name the
# sshd's port (a torchrun inside the session picks its own), and the launch id finds the task's process.
NOT_FOR_LOGINS = frozenset(
    {
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "NODE_RANK",
        "LOCAL_RANK",
        "YARD_LAUNCH_ID",
    }
)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class DevError(Exception):
    """The session cannot be prepared on this node: the message says why, for the task's log."""


@dataclass
class DevInfo:
    """A dev task's journaled state: where its sshd listens, its host key, the keys written, the activity seen."""

    dir: str
    port: int
    endpoint: str | None
    host_key: str | None
    login: str
    # The keys in authorized_keys now (what the spec said at the last reconcile that wrote them).
    keys: list[str] = field(default_factory=list)
    # (uid, gid) the session's files belong to: the owner's, run as the owner; else None (the agent's).
    owner: list[int] | None = None
    # The agent's clock when it last saw an SSH connection open (None: never).
    last_activity: float | None = None

    @property
    def authorized_keys(self) -> Path:
        return Path(self.dir) / "authorized_keys"


def find_sshd() -> str | None:
    """OpenSSH's server: on PATH (the agent's), else where Debian and source builds put it."""
    found = shutil.which("sshd")
    if found:
        return found
    return next((p for p in SSHD_CANDIDATES if os.access(p, os.X_OK)), None)


def clean_keys(spec: Mapping[str, Any]) -> list[str]:
    """The spec's public keys as authorized_keys lines: one key a line, no control characters (a newline
    would start a line of its own, options and all), no duplicates, in the portal's order."""
    dev = spec.get("dev") if isinstance(spec.get("dev"), dict) else {}
    raw = dev.get("authorized_keys") if isinstance(dev, dict) else None
    keys: list[str] = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, str):
            continue
        key = item.strip()
        if key and len(key) <= KEY_MAX and not any(ord(c) < 0x20 or ord(c) == 0x7F for c in key) and key not in keys:
            keys.append(key)
    return keys[:KEYS_MAX]


def quote(value: str) -> str:
    """A value for sshd_config: double-quoted, with the two characters OpenSSH's argv_split unescapes there
    (backslash, double quote) escaped. A newline cannot be said in its line-based format (callers refuse it)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def login_env(env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """(the variables every login gets, the names left out because sshd_config cannot carry them)."""
    given: dict[str, str] = {}
    refused: list[str] = []
    for name, value in sorted(env.items()):
        if name in NOT_FOR_LOGINS:
            continue
        if not _NAME.fullmatch(name) or any(c in value for c in "\n\r\0"):
            refused.append(name)
            continue
        given[name] = value
    return given, refused


def endpoint(address: str, port: int) -> str | None:
    """``address:port`` (an IPv6 address in brackets) for the portal's tunnel, or None when it would not fit."""
    host = f"[{address}]" if ":" in address else address
    text = f"{host}:{port}"
    return text if port > 0 and len(text) <= DEV_ENDPOINT_MAX else None


def sshd_config(
    *,
    folder: Path,
    address: str,
    port: int,
    login: str,
    env: Mapping[str, str],
    forwarding: Mapping[str, Any],
) -> str:
    """The session's sshd_config (docs/dev-sessions.md, "sshd")."""

    def yes(flag: str) -> str:
        return "yes" if forwarding.get(flag) is True else "no"

    lines = [
        "# Written by yard-agent for this dev session; it is regenerated, not edited.",
        f"ListenAddress {quote(address)}",
        f"Port {port}",
        f"HostKey {quote(str(folder / 'ssh_host_ed25519_key'))}",
        f"PidFile {quote(str(folder / 'sshd.pid'))}",
        f"AuthorizedKeysFile {quote(str(folder / 'authorized_keys'))}",
        # One file for every account: only the session's login account may use it.
        f"AllowUsers {quote(login)}",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes",
        # An agent running as root without --run-as-owner runs its tasks as root, so its sessions log in
        # as root: with its keys only. Any other login account is not root, and root stays out.
        f"PermitRootLogin {'prohibit-password' if login == 'root' else 'no'}",
        "UsePAM no",
        # The session's files are the agent's (or the owner's), in the agent's state directory.
        "StrictModes no",
        f"AllowAgentForwarding {yes('allow_agent_forwarding')}",
        f"AllowTcpForwarding {yes('allow_tcp_forwarding')}",
        f"X11Forwarding {yes('allow_x11_forwarding')}",
        "PermitTTY yes",
        "PrintMotd no",
        "Subsystem sftp internal-sftp",
        "ClientAliveInterval 30",
        "LogLevel INFO",
    ]
    if env:
        # sshd takes the first SetEnv line only: every variable goes on this one.
        lines.append("SetEnv " + " ".join(quote(f"{name}={value}") for name, value in env.items()))
    return "\n".join(lines) + "\n"


def write_private(path: Path, text: str, owner: tuple[int, int] | None) -> None:
    """Write `path` (0600, `owner`'s) through a fresh file renamed into place: never through a link, even
    in a folder its owner may change (every change of the file is made on the descriptor)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fchmod(handle.fileno(), 0o600)
            if owner is not None:
                os.fchown(handle.fileno(), *owner)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_keys(info: DevInfo, keys: list[str]) -> None:
    owner = (info.owner[0], info.owner[1]) if info.owner else None
    write_private(info.authorized_keys, "".join(f"{k}\n" for k in keys), owner)
    info.keys = list(keys)


def _host_key(pub: Path) -> str | None:
    """``<type> <base64>`` of the session's host key (its comment left out)."""
    parts = pub.read_text().split()
    key = " ".join(parts[:2]) if len(parts) >= 2 else None
    return key if key is not None and len(key) <= DEV_HOST_KEY_MAX else None


def _check(sshd: str, config: Path) -> None:
    """``sshd -t``: the configuration and the host key, before the task is started. An sshd run as root
    wants its privilege separation folder (/run/sshd on Debian, made by its service unit, which may never
    have run here): made when it is missing, as the unit would."""
    for _ in range(2):
        done = subprocess.run([sshd, "-t", "-f", str(config)], capture_output=True, text=True, timeout=KEYGEN_TIMEOUT_S)
        if done.returncode == 0:
            return
        said = (done.stderr or done.stdout).strip()
        missing = re.search(r"Missing privilege separation directory: (/\S+)", said)
        if missing is None or os.geteuid() != 0:
            raise DevError(f"sshd refuses the session's configuration: {said[-500:]}")
        os.makedirs(missing.group(1), mode=0o755, exist_ok=True)
    raise DevError(f"sshd refuses the session's configuration: {said[-500:]}")


def prepare(
    *,
    spec: Mapping[str, Any],
    workdir: Path,
    address: str,
    env: Mapping[str, str],
    account: pwd.struct_passwd | None,
    log: logging.LoggerAdapter[Any] | logging.Logger,
    image: bool = False,
) -> tuple[DevInfo, str]:
    """Make the session's folder (host key, authorized_keys, sshd_config) and return its journaled state
    and the task's command. Raises DevError (the node cannot) or OSError (its disk).

    ``image``: the session runs in a container of its image (docs/dev-sessions.md, "In an image"): the
    command runs the image's sshd there, not the node's, and the login account is root (the container's
    uid 0) or the owner's where the agent runs tasks as their owners."""
    sshd = None if image else find_sshd()
    if sshd is None and not image:
        raise DevError(NO_SSHD)
    keygen = shutil.which("ssh-keygen")
    if keygen is None:
        raise DevError(NO_KEYGEN)
    port = int(spec.get("master_port") or 0)
    if not 0 < port < 65536:
        raise DevError(f"the portal gave this dev session no port to listen on (master_port {spec.get('master_port')!r})")
    if account is not None:
        login = account.pw_name
    elif image:
        login = "root"  # the container runs as its uid 0 when the agent does not run tasks as their owners
    else:
        try:
            login = pwd.getpwuid(os.geteuid()).pw_name
        except KeyError as exc:
            raise DevError(f"the agent's uid {os.geteuid()} has no account name: no one could log in") from exc
    folder = workdir / "sshd"
    # Made by the agent and handed to the owner last: nothing in it can be swapped meanwhile.
    folder.mkdir(mode=0o700, exist_ok=True)
    host_key = folder / "ssh_host_ed25519_key"
    for old in (host_key, host_key.with_name(host_key.name + ".pub")):
        old.unlink(missing_ok=True)
    done = subprocess.run(
        [keygen, "-q", "-t", "ed25519", "-N", "", "-C", f"yard-dev-{spec.get('task_id')}", "-f", str(host_key)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=KEYGEN_TIMEOUT_S,
    )
    if done.returncode != 0:
        raise DevError(f"ssh-keygen could not make the session's host key: {(done.stderr or done.stdout).strip()[-500:]}")
    given, refused = login_env(env)
    if refused:
        log.warning("task %s: not given to SSH logins (sshd_config cannot carry them): %s", spec.get("task_id"), refused)
    dev = spec.get("dev") if isinstance(spec.get("dev"), dict) else {}
    config = folder / "sshd_config"
    write_private(
        config,
        sshd_config(folder=folder, address=address, port=port, login=login, env=given, forwarding=dev or {}),
        None,
    )
    info = DevInfo(
        dir=str(folder),
        port=port,
        endpoint=endpoint(address, port),
        host_key=_host_key(host_key.with_name(host_key.name + ".pub")),
        login=login,
    )
    write_keys(info, clean_keys(spec))
    if sshd is not None:
        _check(sshd, config)
    if account is not None:
        info.owner = [account.pw_uid, account.pw_gid]
        for path in folder.iterdir():
            os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)
        os.chown(folder, account.pw_uid, account.pw_gid)
    if sshd is None:
        return info, image_command(config, login)
    # exec: sshd replaces the shell, so it is the process that gets the signals.
    return info, "exec " + shlex.join([sshd, "-D", "-e", "-f", str(config)])


def image_command(config: Path, login: str) -> str:
    """The container's shell command for a session in an image: the image's sshd (on its PATH, else where
    Debian and source builds put it) checked with ``sshd -t`` (the privilege separation folder it names made
    where it is missing, as the host's _check does; Debian's /run/sshd made first), then exec'd in the
    foreground.
    The agent cannot look inside the image before it runs, so the search is the container's shell's; what
    the image lacks is said in the task's log (exit 127: no sshd; 1: no login account, a refused config)."""
    cfg, who = shlex.quote(str(config)), shlex.quote(login)
    no_sshd = shlex.quote(f"yard-agent: this image has no sshd on its PATH nor in /usr/sbin: {NO_SSHD_IN_IMAGE}")
    no_login = shlex.quote(
        f"yard-agent: this image has no account {login} in its /etc/passwd: sshd cannot log anyone in as it "
        "(add the account to the image, or run the session without an image)"
    )
    refused = shlex.quote("yard-agent: the image's sshd refuses the session's configuration:")
    return (
        "S=$(command -v sshd 2>/dev/null); "
        'for p in /usr/sbin/sshd /usr/local/sbin/sshd; do [ -n "$S" ] && break; [ -x "$p" ] && S=$p; done; '
        f'[ -n "$S" ] || {{ echo {no_sshd} >&2; exit 127; }}; '
        f"{{ getent passwd {who} || grep -q ^{who}: /etc/passwd; }} >/dev/null 2>&1 || {{ echo {no_login} >&2; exit 1; }}; "
        # Debian's and Ubuntu's sshd, run as root, wants /run/sshd, which images rarely hold (their Dockerfiles
        # make it) and which `sshd -t` does not ask for: made where it can be (the container's own layer).
        "mkdir -p -m 0755 /run/sshd 2>/dev/null; "
        f'if ! T=$("$S" -t -f {cfg} 2>&1); then '
        "D=$(printf '%s\\n' \"$T\" | sed -n 's/.*Missing privilege separation directory: \\(\\/[^ ]*\\).*/\\1/p'); "
        f'if [ -n "$D" ] && mkdir -p -m 0755 "$D" 2>/dev/null; then :; else echo {refused} "$T" >&2; exit 1; fi; '
        "fi; "
        f'exec "$S" -D -e -f {cfg}'
    )


# -- the running session: its report, and its sessions' end ------------------------------------------------

Proc = tuple[int, int]  # (pid, start ticks): one process for good


def _tree() -> dict[int, list[int]]:
    """Every process's children, from one pass over /proc."""
    children: dict[int, list[int]] = {}
    for pid, proc in cgroups.scan_proc().items():
        children.setdefault(proc.ppid, []).append(pid)
    return children


def _descendants(root: int, children: Mapping[int, list[int]]) -> set[int]:
    seen: set[int] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def _comm(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", "rb") as handle:
            return handle.read().decode(errors="replace").strip()
    except OSError:
        return None


def _listener(wrapper: int, children: Mapping[int, list[int]]) -> int | None:
    """sshd's listening process: the first ``sshd`` below the task's wrapper, breadth first. On the node it
    is the wrapper's child; in an image it is further down (runc, the container's init and shell), in the
    container's pid namespace but seen by its host pid here. Its children are the connections."""
    level = list(children.get(wrapper, ()))
    for _ in range(8):
        for pid in level:
            if _comm(pid) == "sshd":
                return pid
        level = [child for pid in level for child in children.get(pid, ())]
        if not level:
            break
    return None


class DevSessions:
    """What the agent sees of its dev tasks' sshd: the SSH connections, and the processes of each session
    (remembered, so that they end with the task even once the listener that was their parent is gone)."""

    def __init__(self) -> None:
        self.sessions: dict[tuple[int, int], set[Proc]] = {}

    def _look(self, key: tuple[int, int], wrapper: int, ticks: int | None) -> int:
        """The connections sshd holds now (its listener's children: one per connection, logged in or still
        authenticating), remembering every process below the task's wrapper."""
        if not launcher.process_alive(wrapper, ticks):
            return 0  # gone (its pid may be another process's by now)
        children = _tree()
        known = self.sessions.setdefault(key, set())
        for pid in _descendants(wrapper, children):
            started = launcher.start_ticks(pid)
            if started is not None:  # else gone already, and its pid free for another process
                known.add((pid, started))
        listener = _listener(wrapper, children)
        return len(children.get(listener, ())) if listener is not None else 0

    def report(
        self, key: tuple[int, int], info: DevInfo, *, pid: int | None, ticks: int | None, running: bool, now: float
    ) -> dict[str, Any]:
        """The heartbeat's ``dev`` object. ``last_activity``: when the agent last saw a connection open."""
        connections: int | None = None
        if running and pid is not None:
            connections = min(self._look(key, pid, ticks), DEV_CONNECTIONS_MAX)
            self._prune(key)
            if connections:
                info.last_activity = now
        return {
            "endpoint": info.endpoint,
            "login": info.login,
            "host_key": info.host_key,
            "connections": connections,
            "last_activity": info.last_activity,
        }

    def _prune(self, key: tuple[int, int]) -> None:
        known = self.sessions.get(key)
        if known:
            known.difference_update({p for p in known if not launcher.process_alive(*p)})

    def signal(self, key: tuple[int, int], pid: int | None, ticks: int | None, signum: signal.Signals) -> None:
        """Give every process of the task's SSH sessions `signum` (the task's group gets it from its caller):
        those below its wrapper now, and those seen there before (their listener may be gone)."""
        if pid is not None:
            self._look(key, pid, ticks)
        for proc, started in self.sessions.get(key, set()):
            if proc != pid and launcher.process_alive(proc, started):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc, signum)

    def forget(self, key: tuple[int, int]) -> None:
        self.sessions.pop(key, None)
