"""Real servers for the notebook proxy's tests: the notebook proxy itself (uvicorn serving portal.asgi in a
thread of the test process, so it shares the test database), a real JupyterLab started exactly as the
agent starts it (nodeagent/notebook.py), and a running notebook job pointing at it."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from nodeagent.notebook import notebook_command, plan_notebook
from scheduling.agent.views import seal_url
from scheduling.models import Gpu, Job, JobKind, Task
from scheduling.states import JobState
from tests.factories import make_job


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def proxy_server(*, name: str = "127.0.0.1") -> Iterator[str]:
    """The notebook proxy (and Django behind it) on 127.0.0.1, as `make run` serves it; its URL names the
    host ``name`` (a browser sends the portal's cookies to the same host name on another port)."""
    from portal.asgi import application

    port = free_port()
    config = uvicorn.Config(application, host="127.0.0.1", port=port, ws="websockets-sansio", lifespan="on", log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="notebook-proxy", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the notebook proxy did not start"
        time.sleep(0.05)
    try:
        yield f"http://{name}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


@dataclass
class Jupyter:
    process: subprocess.Popen[bytes]
    url: str  # as the agent reports it: with ?token=
    token: str
    base: str  # http://127.0.0.1:port/notebooks/<id>/lab/


@contextmanager
def jupyter_for(job_id: int, root: Path) -> Iterator[Jupyter]:
    """JupyterLab for notebook ``job_id``, started with the agent's own command and environment."""
    env = {**os.environ, "YARD_JOB_ID": str(job_id), "JUPYTER_RUNTIME_DIR": str(root / ".runtime")}
    info = plan_notebook(address="127.0.0.1", env=env)
    command = notebook_command(info, address="127.0.0.1", root_dir=root)
    log = open(root / "jupyter.log", "ab")  # noqa: SIM115 - the child holds it
    process = subprocess.Popen(["bash", "-c", command], env=env, stdout=log, stderr=log, start_new_session=True)
    base = info.url.split("?")[0]
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                request = urllib.request.Request(base + "api/status", headers={"Authorization": f"token {info.token}"})
                urllib.request.urlopen(request, timeout=5)
                break
            except OSError:
                assert process.poll() is None, (root / "jupyter.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "JupyterLab did not answer"
                time.sleep(0.3)
        yield Jupyter(process=process, url=info.url, token=info.token, base=base)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)


def running_notebook(*, team: Any, user: Any, url: str = "") -> Job:
    """A RUNNING notebook job whose task reports ``url`` (sealed, as the agent API stores it), answering."""
    job = make_job(team=team, user=user, kind=JobKind.NOTEBOOK, state=JobState.RUNNING, command="")
    node = Gpu.objects.first().node  # type: ignore[union-attr]
    Task.objects.create(
        job=job, attempt=1, rank=0, node=node, state="RUNNING", notebook_url=seal_url(url) or "", notebook_kernel_busy=False
    )
    return job


def point_at(job: Job, jupyter: Jupyter) -> None:
    Task.objects.filter(job=job).update(notebook_url=seal_url(jupyter.url))


async def execute(
    ws_url: str, code: str, *, headers: dict[str, str], subprotocols: list[str] | None = None, open_timeout: float = 20
) -> str:
    """Run ``code`` in a kernel over its websocket (Jupyter's message protocol, as JupyterLab speaks it) and
    return what it printed. The handshake waits for the kernel's first answer (``open_timeout``)."""
    import websockets

    async with websockets.connect(
        ws_url,
        additional_headers=headers,
        subprotocols=subprotocols,
        open_timeout=open_timeout,  # type: ignore[arg-type]
    ) as socket_:
        msg_id = uuid.uuid4().hex
        header = {
            "msg_id": msg_id,
            "username": "test",
            "session": uuid.uuid4().hex,
            "msg_type": "execute_request",
            "version": "5.3",
        }
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
        message = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell", "buffers": []}
        await socket_.send(json.dumps(message))
        printed = []
        while True:
            reply = json.loads(await asyncio.wait_for(socket_.recv(), timeout=60))
            if reply.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if reply["msg_type"] == "stream":
                printed.append(reply["content"]["text"])
            if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
                return "".join(printed)
