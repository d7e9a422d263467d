"""yard ssh, yard ssh-key: SSH into a dev session through the portal (docs/dev-sessions.md, "Connecting").

No node port is open to people: ssh's ProxyCommand runs `yard ssh --proxy <id>`, which opens the session's
tunnel (a websocket to the portal's ASGI server, authenticated with this CLI's token) and copies stdin to
it and it to stdout. SSH runs end to end through it, so the session's host key is checked as any other:
`yard ssh --config` pins the key the portal reported in a known-hosts file of the CLI's own, under the
Host alias, and ssh is told to trust nothing else (StrictHostKeyChecking yes).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import click

from yardcli import __version__
from yardcli.client import Api, ApiError, config_dir, config_load
from yardcli.commands.common import _api, _fail, _print_json, _table, _when, api_command, err, json_option, out
from yardcli.commands.dev import session_get

KEYS = "/api/v1/ssh-keys"
KNOWN_HOSTS = "known_hosts"
DEFAULT_KEY = Path("~/.ssh/id_ed25519.pub")
CHUNK = 64 * 1024
OPEN_TIMEOUT_S = 30.0


def alias(session_id: int) -> str:
    return f"yard-{session_id}"


# --------------------------------------------------------------------------- yard ssh-key


@click.group("ssh-key")
def ssh_key() -> None:
    """Your SSH public keys: what your dev sessions' sshd lets in (add, list, remove)."""


def _public_key_text(source: str) -> str:
    """The one-line public key in ``source`` (a file, or - for stdin). A private key is refused here, before it
    could leave this machine."""
    if source == "-":
        text = sys.stdin.read()
    else:
        path = Path(source).expanduser()
        try:
            text = path.read_text(errors="replace")
        except FileNotFoundError:
            hint = " (make one with: ssh-keygen -t ed25519)" if source == str(DEFAULT_KEY) else ""
            raise click.BadParameter(f"{path}: no such file{hint}", param_hint="FILE") from None
        except OSError as exc:
            raise click.BadParameter(f"{path}: {exc.strerror}", param_hint="FILE") from None
    if "PRIVATE KEY" in text:
        raise click.BadParameter(
            f"{source} is a PRIVATE key: give its public half (the .pub file); it was not sent", param_hint="FILE"
        )
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if len(lines) != 1:
        raise click.BadParameter(f"{source}: expected one public key line ('<type> <base64> [comment]'), found {len(lines)}")
    return lines[0]


@ssh_key.command("add")
@click.argument("source", metavar="[FILE|-]", default=str(DEFAULT_KEY))
@click.option("--name", default="", help="What it is, e.g. laptop (default: the key's comment, user@host)")
@json_option
@api_command
def ssh_key_add(source: str, name: str, as_json: bool) -> None:
    """Add a public key (default ~/.ssh/id_ed25519.pub; - reads stdin). Your running sessions let it in within
    seconds."""
    key = _api().post(KEYS, json={"name": name, "public_key": _public_key_text(source)})
    if as_json:
        _print_json(key)
        return
    out.print(f"Added SSH key {key['id']} {key['name']} ({key['key_type']} {key['fingerprint']})", markup=False)


@ssh_key.command("list")
@json_option
@api_command
def ssh_key_list(as_json: bool) -> None:
    """Your SSH public keys (id, name, type, fingerprint)."""
    keys = _api().get(KEYS)
    if as_json:
        _print_json(keys)
        return
    _table(
        ["ID", "NAME", "TYPE", "FINGERPRINT", "ADDED"],
        [[k["id"], k["name"], k["key_type"], k["fingerprint"], _when(k.get("created_at"))] for k in keys],
    )
    if not keys:
        out.print("no SSH keys: add yours with yard ssh-key add [FILE]", markup=False)


@ssh_key.command("remove")
@click.argument("key_id", type=click.IntRange(1))
@json_option
@api_command
def ssh_key_remove(key_id: int, as_json: bool) -> None:
    """Remove one of your keys (by its ID from `yard ssh-key list`): sessions stop letting it in within seconds."""
    _api().request("DELETE", f"{KEYS}/{key_id}")
    if as_json:
        _print_json({"id": key_id, "removed": True})
        return
    out.print(f"Removed SSH key {key_id}", markup=False)


# --------------------------------------------------------------------------- yard ssh


def _ssh_of(api: Api, session_id: int) -> dict[str, Any]:
    """The session's ``ssh`` object; a clear error while it is not running or its sshd has not reported."""
    session = session_get(api, session_id)
    ssh = session.get("ssh") or {}
    if session.get("state") != "RUNNING":
        _fail(f"dev session {session_id} is {session.get('state')}, not running; `yard dev status {session_id}` says more")
    if not ssh.get("proxy_url") and not ssh.get("proxy_path"):
        _fail(f"dev session {session_id} runs, but its SSH server has not started yet: try again in a few seconds")
    return dict(ssh)


def _proxy_url(api: Api, ssh: dict[str, Any]) -> str:
    url = str(ssh.get("proxy_url") or "")
    if not url:  # a path only: on the API's own address
        url = api.url + str(ssh["proxy_path"])
    return re.sub(r"^http", "ws", url)  # http(s):// -> ws(s)://


def yard_command() -> list[str]:
    """How ssh runs this same `yard`: the console script's absolute path, or this interpreter with -m."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 and not argv0.endswith(("__main__.py", ".py")):
        found = argv0 if os.sep in argv0 else shutil.which(argv0)
        if found:
            return [os.path.abspath(found)]
    return [sys.executable, "-m", "yardcli"]


def _config_value(value: str) -> str:
    """A value as ssh_config reads it: % is its token character, and a path with spaces is quoted."""
    value = value.replace("%", "%%")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def _proxy_command(session_id: int) -> str:
    command = " ".join(shlex.quote(part) for part in [*yard_command(), "ssh", "--proxy", str(session_id)])
    xdg = os.environ.get("XDG_CONFIG_HOME")
    if xdg:  # where this CLI keeps its login: ssh (or VS Code) may run the command without this variable
        command = f"env XDG_CONFIG_HOME={shlex.quote(xdg)} {command}"
    return command.replace("%", "%%")


def known_hosts_pin(session_id: int, host_key: str) -> Path:
    """Write the session's host key to the CLI's own known-hosts file under its Host alias (replacing an
    older line for that alias), 0600 in the 0700 config directory."""
    fields = host_key.split()
    if len(fields) < 2:
        _fail(f"dev session {session_id}: the portal's host key is not an SSH public key ({host_key[:40]!r})")
    name = alias(session_id)
    directory = config_dir()
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    path = directory / KNOWN_HOSTS
    kept = []
    if path.exists():
        kept = [line for line in path.read_text().splitlines() if name not in line.split(" ", 1)[0].split(",")]
    temporary = directory / f".{KNOWN_HOSTS}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("\n".join([*kept, f"{name} {fields[0]} {fields[1]}"]) + "\n")
    os.replace(temporary, path)
    return path


def ssh_options(session_id: int, ssh: dict[str, Any]) -> list[tuple[str, str]]:
    """The ssh_config options of a session, its host key pinned first."""
    if not ssh.get("host_key"):
        _fail(f"dev session {session_id} runs, but its SSH server has not reported its host key yet: try again shortly")
    known = known_hosts_pin(session_id, str(ssh["host_key"]))
    return [
        ("User", _config_value(str(ssh["user"]))),
        ("ProxyCommand", _proxy_command(session_id)),
        ("HostKeyAlias", alias(session_id)),
        ("UserKnownHostsFile", _config_value(str(known))),
        ("StrictHostKeyChecking", "yes"),
    ]


def _warn_without_keys(api: Api) -> None:
    try:
        if not api.get(KEYS):
            err.print("warning: you have no SSH keys on the portal, so sshd will let nobody in: yard ssh-key add", markup=False)
    except ApiError:
        pass


def _warn_if_env_only() -> None:
    if not config_load() and os.environ.get("YARD_TOKEN"):
        err.print(
            "note: ssh runs `yard ssh --proxy`, which needs YARD_URL and YARD_TOKEN where it runs, or `yard login`",
            markup=False,
        )


@click.command("ssh", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--proxy", "mode", flag_value="proxy", help="Be ssh's ProxyCommand: stdin/stdout <-> the session's tunnel")
@click.option("--config", "mode", flag_value="config", help="Print an ssh_config Host block (host key pinned) for ~/.ssh/config")
@click.option(
    "-l",
    "--login",
    help="The account to log in as (default: the one the session's sshd lets in, as the portal reports it)",
)
@click.argument("session_id", type=click.IntRange(1))
@click.argument("ssh_args", nargs=-1, type=click.UNPROCESSED)
@api_command
def ssh(mode: str | None, login: str | None, session_id: int, ssh_args: tuple[str, ...]) -> None:
    """SSH into dev session SESSION_ID through the portal; after -- come ssh's own arguments or a command.

    \b
      yard ssh 42                          # a shell
      yard ssh 42 -- nvidia-smi            # a command
      yard ssh 42 -- -L 8888:localhost:8888
      yard ssh --config 42 >> ~/.ssh/config   # then ssh yard-42, scp, rsync, VS Code Remote-SSH
    """
    if ssh_args[:1] == ("--",):  # `yard ssh 42 -- cmd`: the separator is this command's, not ssh's
        ssh_args = ssh_args[1:]
    api = _api()
    if mode == "proxy":
        if ssh_args:
            raise click.UsageError("yard ssh --proxy takes only the session's id")
        _proxy(api, session_id)
    ssh_obj = _ssh_of(api, session_id)
    if login:
        ssh_obj["user"] = login
    options = ssh_options(session_id, ssh_obj)
    _warn_if_env_only()
    if mode == "config":
        if ssh_args:
            raise click.UsageError("yard ssh --config takes only the session's id")
        _warn_without_keys(api)
        click.echo(f"Host {alias(session_id)}")
        for key, value in options:
            click.echo(f"    {key} {value}")
        return
    _warn_without_keys(api)
    binary = shutil.which("ssh")
    if binary is None:
        _fail("ssh is not installed: install the OpenSSH client (it comes with macOS, Windows 10+, and most Linux)")
    argv = ["ssh"]
    for key, value in options:
        argv += ["-o", f"{key}={value}"]
    argv += [alias(session_id), *ssh_args]
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt":  # Windows has no exec that keeps the console: run ssh and pass its status on
        import subprocess

        sys.exit(subprocess.call([binary, *argv[1:]]))
    os.execv(binary, argv)


# --------------------------------------------------------------------------- the tunnel (ProxyCommand)


def _proxy(api: Api, session_id: int) -> NoReturn:
    """stdin -> binary frames, frames -> stdout, until either side ends. Nothing but SSH's bytes on stdout."""
    url = _proxy_url(api, _ssh_of(api, session_id))
    sys.exit(tunnel(url, api.token, session_id=session_id))


def _refusal_message(status: int, body: bytes | bytearray | None) -> str:
    try:
        message = str(json.loads(body or b"").get("message") or "")
    except (ValueError, AttributeError):
        message = ""
    return message or f"HTTP {status}"


def tunnel(url: str, token: str, *, session_id: int, stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Copy ``stdin_fd`` to the websocket at ``url`` and the websocket to ``stdout_fd``; the exit status."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
    from websockets.sync.client import connect

    try:
        ws = connect(
            url,
            additional_headers={"Authorization": f"Bearer {token}"},
            user_agent_header=f"yard/{__version__}",
            compression=None,  # SSH's bytes are encrypted: they do not compress
            max_size=None,
            open_timeout=OPEN_TIMEOUT_S,
            ping_interval=20,
            ping_timeout=60,
            close_timeout=5,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        message = _refusal_message(status, exc.response.body)
        err.print(f"yard ssh: dev session {session_id}: the portal refused the tunnel ({status}): {message}", markup=False)
        return 1
    except (OSError, InvalidHandshake, InvalidURI, TimeoutError) as exc:
        err.print(f"yard ssh: dev session {session_id}: cannot open the tunnel at {url}: {exc}", markup=False)
        return 1

    def upstream() -> None:
        try:
            while data := os.read(stdin_fd, CHUNK):
                ws.send(data)
        except (ConnectionClosed, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):  # closing a connection that is gone already
                ws.close()

    threading.Thread(target=upstream, name="stdin-to-tunnel", daemon=True).start()
    try:
        while True:
            frame = ws.recv()
            view = memoryview(frame.encode() if isinstance(frame, str) else frame)
            while view:
                view = view[os.write(stdout_fd, view) :]
    except ConnectionClosed as exc:
        code, reason = (exc.rcvd.code, exc.rcvd.reason) if exc.rcvd is not None else (1006, "")
        if code in (1000, 1001) or (exc.sent is not None and exc.rcvd_then_sent is not True):
            return 0  # an end: ssh's (stdin closed), the sshd's, or the portal's shutdown
        err.print(
            f"yard ssh: dev session {session_id}: the tunnel was closed ({code}{': ' + reason if reason else ''})",
            markup=False,
        )
        return 1
    except OSError:  # stdout is gone: ssh has ended
        ws.close()
        return 0
