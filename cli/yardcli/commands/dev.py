"""yard dev launch, list, status, stop: dev sessions (docs/dev-sessions.md) over /api/v1/dev-sessions — GPUs
on a node with an SSH server for you alone, reached with `yard ssh <id>` (yardcli/commands/ssh.py)."""

from __future__ import annotations

import time
from typing import Any

import click

from yardcli import result as r
from yardcli.client import Api
from yardcli.commands.common import (
    _api,
    _duration_s,
    _fail,
    _only_team,
    _poll_s,
    _print_json,
    _table,
    _when,
    api_command,
    err,
    json_option,
    out,
)
from yardcli.commands.jobs import _list, _reason

BASE = "/api/v1/dev-sessions"
LIVE = ("PENDING", "STARTING", "RUNNING", "PREEMPTING")


def session_get(api: Api, session_id: int) -> dict[str, Any]:
    return dict(api.get(f"{BASE}/{session_id}"))


@click.group()
def dev() -> None:
    """Dev sessions: GPUs on a node and an SSH server for you alone, for a terminal or VS Code Remote-SSH
    (launch, list, status, stop). Add your key once with `yard ssh-key add`, then `yard ssh <id>`.

    \b
      yard ssh-key add                      # ~/.ssh/id_ed25519.pub
      yard dev launch --gpus 2 --gpu-type H100 --wait
      yard ssh 42                           # or: yard ssh 42 -- nvidia-smi
      yard ssh --config 42 >> ~/.ssh/config # then: ssh yard-42, scp, rsync, VS Code
    """


@dev.command("launch")
@click.option("--name", help="A name for it (default: dev-<your username>)")
@click.option("--team", help="Team slug or id (default: your only team)")
@click.option("-G", "--gpus", type=click.IntRange(1), default=1, show_default=True)
@click.option("--gpu-type", help="GPU type, e.g. H100")
@click.option("--tier", type=click.IntRange(1, 3), help="1 production, 2 research (default), 3 spot")
@click.option("-t", "--time-limit", "time_limit", help="Time limit: seconds, 45m, 8h, 1d12h or HH:MM:SS")
@click.option("--cpus", type=click.IntRange(1), help="CPU cores (default: the cluster's per GPU)")
@click.option("--mem", "memory_mb", type=click.IntRange(1), help="Memory in MiB (default: the cluster's per GPU)")
@click.option("--wait", is_flag=True, help="Wait until its SSH server is up, then say how to connect")
@json_option
@api_command
def dev_launch(
    name: str | None, team: str | None, gpus: int, gpu_type: str | None, tier: int | None, time_limit: str | None,
    cpus: int | None, memory_mb: int | None, wait: bool, as_json: bool,
) -> None:  # fmt: skip
    """Launch a dev session; the idle reaper stops it when its GPUs sit unused (an open SSH connection alone
    does not keep it)."""
    api = _api()
    payload: dict[str, Any] = {"team": team or _only_team(api), "gpus": gpus}
    optional = {
        "name": name, "gpu_type": gpu_type, "tier": tier, "time_limit_s": _duration_s(time_limit, param="--time-limit"),
        "cpus": cpus, "memory_mb": memory_mb,
    }  # fmt: skip
    payload.update({k: v for k, v in optional.items() if v is not None})
    session = api.post(BASE, json=payload)
    if not as_json:
        out.print(
            f"Launched dev session {session['id']} ({session['name']}): {session['gpus']} {session['gpu_type']}; "
            f"{session.get('pending_reason') or session['state']}",
            markup=False,
        )
    if wait:
        session = _wait_for_ssh(api, int(session["id"]))
        if not as_json:
            out.print(f"dev session {session['id']} is running: connect with `yard ssh {session['id']}`", markup=False)
    if as_json:
        _print_json(session)


def _wait_for_ssh(api: Api, session_id: int) -> dict[str, Any]:
    """Until the session runs and its sshd has reported its host key (a connection before then is refused)."""
    last = ""
    with err.status(f"dev session {session_id}: waiting for it to run"):
        while True:
            session = session_get(api, session_id)
            if session["state"] == "RUNNING" and (session.get("ssh") or {}).get("host_key"):
                return session
            if session["state"] in r.TERMINAL:
                _fail(f"dev session {session_id} is {session['state']}: {session.get('stop_message') or ''}".rstrip(": "))
            line = f"{session['state']}: {_reason(session)}".rstrip(": ")
            if line != last:
                err.print(f"dev session {session_id}: {line}", markup=False, highlight=False)
                last = line
            time.sleep(_poll_s())


@dev.command("list")
@click.option("--all", "all_states", is_flag=True, help="Stopped ones too")
@json_option
@api_command
def dev_list(all_states: bool, as_json: bool) -> None:
    """Your dev sessions."""
    sessions = _list(_api(), BASE, mine=True, team=None, states=() if all_states else LIVE, limit=200)
    if as_json:
        _print_json(sessions)
        return
    rows = [
        [s["id"], s["name"], s["team"]["slug"], s["state"], f"{s['gpus']} {s['gpu_type']}", _when(s["submitted_at"]), _reason(s)]
        for s in sessions
    ]
    _table(["ID", "NAME", "TEAM", "STATE", "GPUS", "LAUNCHED", "REASON / WHERE"], rows)
    if not sessions:
        out.print("no dev sessions: launch one with yard dev launch", markup=False)


@dev.command("status")
@click.argument("session_id", type=click.IntRange(1))
@json_option
@api_command
def dev_status(session_id: int, as_json: bool) -> None:
    """One session: its state, GPUs, node, and its SSH access while it runs (connections, last activity)."""
    session = session_get(_api(), session_id)
    if as_json:
        _print_json(session)
        return
    ssh = session.get("ssh") or {}
    nodes = ", ".join(sorted({str(t["node"]) for t in session.get("tasks") or []}))
    fields = [
        ("dev session", f"{session['id']} {session['name']}"),
        ("team / owner", f"{session['team']['slug']} / {session['user']}"),
        (
            "state",
            session["state"]
            + (f": {session['pending_reason']}" if session["state"] == "PENDING" and session.get("pending_reason") else ""),
        ),
        ("gpus", f"{session['gpus']} {session['gpu_type']}, tier {session['tier']}"),
        ("node", nodes),
        ("started", _when(session.get("started_at"))),
        ("time limit", f"{session['time_limit_s']} s" if session.get("time_limit_s") else ""),
        ("ended", _when(session.get("ended_at"))),
        ("ssh user", ssh.get("user", "")),
        ("connections", "" if not ssh or ssh.get("connections") is None else str(ssh["connections"])),
        ("last activity", _when(ssh.get("last_activity"))),
        ("host key", ssh.get("host_key", "")),
        ("connect", f"yard ssh {session['id']}" if ssh.get("host_key") else ""),
    ]
    for label, value in fields:
        if value not in (None, ""):
            out.print(f"[bold]{label:>13}[/]  ", end="", markup=True)
            out.print(str(value), markup=False)


@dev.command("stop")
@click.argument("session_id", type=click.IntRange(1))
@json_option
@api_command
def dev_stop(session_id: int, as_json: bool) -> None:
    """Stop a dev session: its sshd and everything you started in it get SIGTERM, then SIGKILL after the grace."""
    session = _api().post(f"{BASE}/{session_id}/stop")
    if as_json:
        _print_json(session)
        return
    head = f"dev session {session['id']} ({session['name']})"
    state = str(session.get("state", ""))
    if state in r.TERMINAL:
        out.print(f"{head}: {state} (ended)", markup=False)
    else:
        out.print(f"{head}: STOPPING (its SSH connections are cut; `yard dev list` shows when it has ended)", markup=False)
