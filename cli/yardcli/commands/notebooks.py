"""yard notebook launch, ls, open, stop: JupyterLab on GPUs, opened through the portal."""

from __future__ import annotations

import time
import webbrowser
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


@click.group()
def notebook() -> None:
    """Jupyter notebooks on GPUs: launch, ls, open, stop."""


@notebook.command("launch")
@click.option("--name", default="notebook", show_default=True)
@click.option("--team", help="Team slug or id (default: your only team)")
@click.option("-G", "--gpus", type=click.IntRange(1), default=1, show_default=True)
@click.option("--gpu-type", help="GPU type, e.g. H100")
@click.option("--tier", type=click.IntRange(1, 3), help="1 production, 2 research (default), 3 spot")
@click.option("-t", "--time", "time_limit", help="Time limit: seconds, 45m, 2h, 1d12h or HH:MM:SS")
@click.option("--image", help="Run Jupyter in this container image (it needs `jupyter` on its PATH and a kernel)")
@click.option("--open", "open_it", is_flag=True, help="Open it in the browser once it runs")
@json_option
@api_command
def notebook_launch(
    name: str, team: str | None, gpus: int, gpu_type: str | None, tier: int | None, time_limit: str | None,
    image: str | None, open_it: bool, as_json: bool,
) -> None:  # fmt: skip
    """Launch a notebook (JupyterLab on GPUs, on the node or in --image); the idle reaper stops it when its
    GPUs sit unused."""
    api = _api()
    payload: dict[str, Any] = {"name": name, "team": team or _only_team(api), "gpus": gpus}
    optional = {"gpu_type": gpu_type, "tier": tier, "time_limit_s": _duration_s(time_limit, param="--time"), "image": image}
    payload.update({k: v for k, v in optional.items() if v is not None})
    nb = api.post("/api/v1/notebooks", json=payload)
    if as_json:
        _print_json(nb)
    else:
        out.print(f"Launched notebook {nb['id']} ({nb['name']}): {nb['gpus']} {nb['gpu_type']}; {nb['pending_reason']}")
    if open_it:
        _open_when_running(api, nb["id"])


def _notebook_page(api: Api, notebook_id: int) -> str:
    # The portal proxies the notebook behind the browser's session: no token in the URL.
    return f"{api.url}/notebooks/{notebook_id}/open"


def _open_when_running(api: Api, notebook_id: int) -> None:
    with err.status(f"notebook {notebook_id}: waiting for it to run"):
        while True:
            nb = api.get(f"/api/v1/notebooks/{notebook_id}")
            if nb["state"] == "RUNNING":
                break
            if nb["state"] in r.TERMINAL:
                _fail(f"notebook {notebook_id} is {nb['state']}")
            time.sleep(_poll_s())
    url = _notebook_page(api, notebook_id)
    out.print(url)
    webbrowser.open(url)


@notebook.command("ls")
@click.option("--all", "all_states", is_flag=True, help="Stopped ones too")
@json_option
@api_command
def notebook_ls(all_states: bool, as_json: bool) -> None:
    """Your notebooks."""
    states = () if all_states else ("PENDING", "STARTING", "RUNNING", "PREEMPTING")
    nbs = _list(_api(), "/api/v1/notebooks", mine=True, team=None, states=states, limit=200)
    if as_json:
        _print_json(nbs)
        return
    rows = [[n["id"], n["name"], n["team"]["slug"], n["state"], f"{n['gpus']} {n['gpu_type']}", _when(n["submitted_at"]),
             _reason(n)] for n in nbs]  # fmt: skip
    _table(["ID", "NAME", "TEAM", "STATE", "GPUS", "LAUNCHED", "REASON / WHERE"], rows)


@notebook.command("open")
@click.argument("notebook_id", type=int)
@click.option("--print", "print_only", is_flag=True, help="Print the URL, do not start a browser")
@json_option
@api_command
def notebook_open(notebook_id: int, print_only: bool, as_json: bool) -> None:
    """Open a running notebook in the browser (through the portal, which checks your session)."""
    api = _api()
    nb = api.get(f"/api/v1/notebooks/{notebook_id}")
    url = _notebook_page(api, notebook_id)
    if as_json:
        _print_json({"id": notebook_id, "state": nb["state"], "url": url})
        return
    if nb["state"] != "RUNNING":
        _fail(f"notebook {notebook_id} is {nb['state']}, not running: {nb.get('pending_reason') or ''}".rstrip(": "))
    out.print(url)
    if not print_only:
        webbrowser.open(url)


@notebook.command("stop")
@click.argument("notebook_id", type=int)
@json_option
@api_command
def notebook_stop(notebook_id: int, as_json: bool) -> None:
    """Stop a notebook (its kernel gets SIGTERM, then SIGKILL after the grace)."""
    nb = _api().post(f"/api/v1/notebooks/{notebook_id}/stop")
    if as_json:
        _print_json(nb)
    else:
        out.print(notebook_stop_words(nb))


def notebook_stop_words(nb: dict[str, Any]) -> str:
    """What `yard notebook stop` says: the state after the stop, not the RUNNING it answered in."""
    head = f"notebook {nb['id']} ({nb['name']})"
    state = str(nb.get("state", ""))
    if state in r.TERMINAL:
        return f"{head}: {state} (ended)"
    if state in ("RUNNING", "STARTING", "PREEMPTING") or nb.get("stop_requested_at"):
        return (
            f"{head}: STOPPING (its kernel got SIGTERM, then SIGKILL after the grace; `yard notebook ls` shows when it has ended)"
        )
    return f"{head}: {state or 'stopping'}"
