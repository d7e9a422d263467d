"""Notebook tasks: a real Jupyter server per task, and its activity for the portal's idle reaper."""

from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shlex
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from nodeagent.journal import NotebookInfo
from nodeagent.launcher import free_port

PROBE_TIMEOUT_S = 2.0
# Probes in a row that a server which has answered may miss before the report says it does not answer.
# The portal's proxy forwards only while it answers: on a loaded node one probe that outlasts its
# timeout would otherwise cut the browser off for a whole heartbeat, while Jupyter itself is fine.
MISSES_TOLERATED = 2
JUPYTER_CONFIG = Path(__file__).resolve().parent / "jupyter_config"


def plan_notebook(*, address: str, env: dict[str, str]) -> NotebookInfo:
    """Pick the port, token and base URL, and put the token in ``env`` (the environment the server is
    started with): never on its command line, where `ps` shows it to every local user.

    The base URL is the portal's path for the notebook, ``/notebooks/<job id>/lab/``: the portal's
    notebook proxy forwards the browser's requests there unchanged (YARD_NOTEBOOK_BASE_URL overrides).
    The URL reported to the portal carries the token, over the agent's own authenticated channel; the
    portal seals it before storing it and adds it to the requests it proxies. No browser sees it.
    """
    port = free_port(address)
    token = secrets.token_urlsafe(24)
    job_id = env.get("YARD_JOB_ID", "")
    base_url = env.get("YARD_NOTEBOOK_BASE_URL") or (f"/notebooks/{job_id}/lab/" if job_id.isdigit() else "/")
    if not base_url.endswith("/"):
        base_url += "/"
    if not base_url.startswith("/"):
        base_url = "/" + base_url
    # Jupyter reads its token from JUPYTER_TOKEN (jupyter_server's IdentityProvider) and logs it as "...".
    env["JUPYTER_TOKEN"] = token
    # JupyterLab writes the token into its page (and from there into websocket URLs) unless a page config
    # says otherwise: ours, searched first, keeps it out (the proxy authenticates every request).
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in (str(JUPYTER_CONFIG), env.get("JUPYTER_CONFIG_PATH", "")) if p)
    host = f"[{address}]" if ":" in address else address
    return NotebookInfo(url=f"http://{host}:{port}{base_url}?token={token}", port=port, token=token, base_url=base_url)


# No update or news check: GPU nodes often have no way out, and a notebook must not wait on one.
LAB_OPTIONS = ("--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate", "--LabApp.news_url=None")


def jupyter_app() -> list[str]:
    """JupyterLab where it is installed (what users expect to open), else the bare Jupyter server."""
    if importlib.util.find_spec("jupyterlab") is not None:
        return ["jupyterlab", *LAB_OPTIONS]
    return ["jupyter_server"]


def server_options(info: NotebookInfo, *, address: str, root_dir: Path, allow_root: bool) -> list[str]:
    """Where the server listens (the address and port the agent planned and probes), under the portal's path."""
    options = [
        f"--ServerApp.ip={address}",
        f"--ServerApp.port={info.port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.open_browser=False",
        f"--ServerApp.base_url={info.base_url}",
        f"--ServerApp.root_dir={root_dir}",
    ]
    return [*options, "--allow-root"] if allow_root else options


def notebook_command(info: NotebookInfo, *, address: str, root_dir: Path) -> str:
    """The node's own Jupyter: this agent's Python runs it."""
    app, *app_options = jupyter_app()
    argv = [
        sys.executable,
        "-m",
        app,
        *app_options,
        *server_options(info, address=address, root_dir=root_dir, allow_root=os.geteuid() == 0),
    ]
    # exec: the server replaces the shell, so it is the process that gets the signals.
    return "exec " + shlex.join(argv)


def image_notebook_command(info: NotebookInfo, *, address: str, root_dir: Path, allow_root: bool) -> str:
    """The image's own Jupyter, in its container (docs/containers.md): what the image must provide is a
    shell and `jupyter` on its PATH, as Kubeflow's and Run:ai's notebook images do. JupyterLab when the
    image has it (`jupyter-lab`), else the bare Jupyter Server (`jupyter server`), with the same options
    as on the host; the token comes in JUPYTER_TOKEN as there. The agent cannot look inside the image
    before it runs, so the choice is the container's shell's."""
    options = server_options(info, address=address, root_dir=root_dir, allow_root=allow_root)
    lab = shlex.join(["jupyter", "lab", *LAB_OPTIONS, *options])
    server = shlex.join(["jupyter", "server", *options])
    missing = (
        "echo \"yard-agent: this image has no jupyter on its PATH ($PATH): a notebook's image needs "
        'JupyterLab or Jupyter Server and a kernel (ipykernel)" >&2; exit 127'
    )
    return (
        f"if command -v jupyter-lab >/dev/null 2>&1; then exec {lab}; "
        f"elif command -v jupyter >/dev/null 2>&1; then exec {server}; "
        f"else {missing}; fi"
    )


def _get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:
        return json.loads(response.read())


def _epoch(iso: object) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


@dataclass
class ProbeMemory:
    """A notebook's last answer to the probe, and how many probes in a row it has missed since."""

    last: dict[str, Any] | None = None
    misses: int = 0


def probe(info: NotebookInfo, *, address: str, memory: ProbeMemory | None = None) -> dict[str, Any]:
    """The heartbeat's `notebook` object; activity fields are None while the server does not answer.

    With ``memory``, a server that has answered before and misses at most MISSES_TOLERATED probes in a
    row is reported as it last answered (a miss on a loaded node is not a server gone)."""
    host = f"[{address}]" if ":" in address else address
    api = f"http://{host}:{info.port}{info.base_url}api/"
    report: dict[str, Any] = {"url": info.url, "kernel_busy": None, "last_activity": None, "kernels": None, "connections": None}
    try:
        status = _get(api + "status", info.token)
        kernels = _get(api + "kernels", info.token)
    except (urllib.error.URLError, OSError, ValueError):
        if memory is not None and memory.last is not None and memory.misses < MISSES_TOLERATED:
            memory.misses += 1
            return dict(memory.last)
        return report
    report["last_activity"] = _epoch(status.get("last_activity"))
    report["kernels"] = status.get("kernels")
    report["connections"] = status.get("connections")
    report["kernel_busy"] = any(k.get("execution_state") == "busy" for k in kernels if isinstance(k, dict))
    if memory is not None:
        memory.last, memory.misses = dict(report), 0
    return report
