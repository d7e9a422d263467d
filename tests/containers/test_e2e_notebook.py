"""A notebook in a container image through the whole stack (issue 26).

The portal is the live server, the notebook proxy (portal/notebook_proxy.py) runs beside it as
`make run` serves it, the cycle runs in-process, and a real ``python -m nodeagent`` (one simulated GPU)
pulls an image with Python, Jupyter Server and ipykernel (bench/oci.py's build_python_image: this
interpreter's Python copied into a rootfs, pushed to Debian's docker-registry on loopback) and runs the
image's Jupyter in a runc container on the host's network. The browser's path is the host notebook's:
the session opens it, the proxy adds the token the agent set up, and a kernel started through the
proxy runs code inside the container (it reads a file only the image has).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import subprocess
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websockets
from django.test import Client

from portal import notebook_proxy
from scheduling.models import JobKind, Task, TaskLogChunk
from scheduling.services import job_cancel
from scheduling.states import JobState
from tests.containers.conftest import IMAGE_MARK, python_image, registry  # noqa: F401  (fixtures used here)
from tests.e2e.conftest import Harness, harness, wait_for  # noqa: F401  (fixtures used here)
from tests.portal.notebook_servers import execute, proxy_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def proxy(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
    monkeypatch.setattr(notebook_proxy, "AUTH_CACHE_S", 0.0)
    with proxy_server() as url:
        settings.YARD_NOTEBOOK_URL = url
        yield url


def run_async(coroutine: Any) -> Any:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=120)


def ok(response: httpx.Response, status: int) -> httpx.Response | None:
    """The response if it has ``status``; None (try again) if the proxy refused to forward it (no answer
    to the agent's last probe: 404 or 502), else a failure saying what came back."""
    if response.status_code == status:
        return response
    assert response.status_code in (404, 502), (response.status_code, response.text[:500])
    return None


def executed(ws: str, code: str, headers: dict[str, str]) -> str | None:
    """What ``code`` printed in the kernel, or None (try again) when the proxy refused the handshake (403)."""
    try:
        return str(run_async(execute(ws, code, headers=headers, open_timeout=90)))
    except websockets.InvalidStatus as exc:
        if exc.response.status_code != 403:
            raise
        return None


def _runc_ids(harness: Harness, name: str) -> list[str]:  # noqa: F811
    state = harness.root / "agents" / name / "runc"
    if not state.exists():
        return []
    done = subprocess.run(["runc", "--root", str(state), "list", "-q"], capture_output=True, text=True, timeout=30)
    return done.stdout.split()


@pytest.fixture
def no_container_left(harness: Harness) -> Iterator[None]:  # noqa: F811
    """A failed test's container is removed: the harness kills the agent and the wrappers (they carry its
    marker), but a container's processes carry only the task's variables and would outlive them."""
    yield
    for name in ("ct-nb",):
        for cid in _runc_ids(harness, name):
            subprocess.run(["runc", "--root", str(harness.root / "agents" / name / "runc"), "delete", "--force", cid], timeout=30)
            merged = harness.root / "agents" / name / "containers" / cid / "rootfs"
            subprocess.run(["umount", "-l", str(merged)], capture_output=True, timeout=30)


def test_a_notebook_in_an_image_runs_its_jupyter_in_a_container_reached_through_the_proxy(
    harness: Harness,  # noqa: F811
    python_image: str,  # noqa: F811
    proxy: str,
    no_container_left: None,
) -> None:
    try:
        harness.start_agent("ct-nb", gpus=1)
        harness.node_ready("ct-nb")
        job = harness.submit("lab-in-an-image", "", kind=JobKind.NOTEBOOK, gpus_per_replica=1, image=python_image)
        harness.place(job)
        harness.job_in(job, JobState.RUNNING, timeout=90)
        # The agent's probe reaches the server (host networking: the address and port it planned), with its token.
        task = wait_for(
            "the agent's probe of the notebook",
            lambda: Task.objects.filter(job=job, notebook_kernel_busy__isnull=False).exclude(notebook_url="").first(),
            timeout=90,
        )
        assert len(_runc_ids(harness, "ct-nb")) == 1, harness.agent_log("ct-nb")[-3000:]

        client = Client()
        client.force_login(harness.user)
        cookies = {"sessionid": client.cookies["sessionid"].value}
        base = f"{proxy}/notebooks/{job.pk}/lab/"
        # The proxy forwards only while the agent's last probe (2 s) got an answer; on a loaded machine a
        # probe can miss while the server starts a kernel, and the next heartbeat's puts it back: retried.
        status = wait_for(
            "the server's status through the proxy",
            lambda: ok(httpx.get(base + "api/status", cookies=cookies, timeout=30), 200),
            timeout=60,
        )
        assert "started" in status.json(), status.text
        assert httpx.get(base + "api/status", timeout=30).status_code == 401  # no session, no way in

        kernel = wait_for(
            "a kernel started through the proxy",
            lambda: ok(
                httpx.post(
                    base + "api/kernels", json={"name": "python3"}, cookies=cookies, headers={"Origin": proxy}, timeout=60
                ),
                201,
            ),
            timeout=120,
        )
        ws = base.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
        headers = {"Cookie": f"sessionid={cookies['sessionid']}", "Origin": proxy}
        code = f"import os; print(open({IMAGE_MARK!r}).read().strip(), os.environ['YARD_JOB_ID'])"
        # The websocket's handshake waits for the kernel's first answer: a kernel starting in a fresh
        # container on a loaded machine may take longer than the host notebook tests allow.
        printed = wait_for("the kernel's answer through the proxy", lambda: executed(ws, code, headers), timeout=150)
        assert f"the yard test's Python image {job.pk}\n" in printed, printed

        # Stopped: the container goes with it.
        job_cancel(job=job, actor=harness.user)
        harness.job_in(job, JobState.CANCELLED, timeout=60)
        task.refresh_from_db()
        wait_for("no container left", lambda: not _runc_ids(harness, "ct-nb"), timeout=30)
    except (AssertionError, httpx.HTTPError, TimeoutError) as exc:
        # What the agent and the notebook said: the failure alone rarely tells which part was slow or refused.
        logs = "".join(
            TaskLogChunk.objects.filter(task__job__name="lab-in-an-image").order_by("offset").values_list("data", flat=True)
        )
        raise AssertionError(
            f"{exc}\n--- agent log:\n{harness.agent_log('ct-nb')[-4000:]}\n--- task log:\n{logs[-4000:]}"
        ) from exc
