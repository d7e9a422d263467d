"""The notebook proxy (portal/notebook_proxy.py) against a real JupyterLab and a real kernel: the session
decides who opens a notebook, the proxy adds the token, the browser's URLs carry none, websockets reach the
kernel, and a stopped notebook is cut off."""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.test import Client

from portal import notebook_proxy
from scheduling.models import Job
from scheduling.states import JobState
from tests.factories import make_user
from tests.portal.notebook_servers import execute, jupyter_for, point_at, proxy_server, running_notebook

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run_async(coroutine: Any) -> Any:
    """``asyncio.run`` in a thread of its own: a session-wide Playwright keeps an event loop running in
    this one once the browser tests have run."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result(timeout=120)


@pytest.fixture
def proxy(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    settings.ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
    monkeypatch.setattr(notebook_proxy, "AUTH_CACHE_S", 0.0)  # each request asks again: no waiting in the tests
    with proxy_server() as url:
        settings.YARD_NOTEBOOK_URL = url
        yield url


def session_of(user: Any) -> dict[str, str]:
    client = Client()
    client.force_login(user)
    return {"sessionid": client.cookies["sessionid"].value}


@pytest.fixture
def lab(cast: Any, tmp_path: Path) -> Iterator[tuple[Job, Any]]:
    job = running_notebook(team=cast.org.team_a, user=cast.ann)
    with jupyter_for(job.pk, tmp_path) as jupyter:
        point_at(job, jupyter)
        yield job, jupyter


def test_the_owner_reaches_jupyter_through_the_proxy_without_a_token(proxy, cast, lab):
    job, jupyter = lab
    answer = httpx.get(f"{proxy}/notebooks/{job.pk}/lab/api/status", cookies=session_of(cast.ann))
    assert answer.status_code == 200 and "started" in answer.json()
    page = httpx.get(f"{proxy}/notebooks/{job.pk}/lab/", cookies=session_of(cast.ann), follow_redirects=True)
    assert page.status_code == 200 and "JupyterLab" in page.text
    assert jupyter.token not in page.text and "token=" not in str(page.url)


def test_the_team_lead_and_admins_may_open_it_a_teammate_may_not(proxy, cast, lab):
    job, _ = lab
    url = f"{proxy}/notebooks/{job.pk}/lab/api/status"
    for person in (cast.lea, cast.oli, cast.cat):
        assert httpx.get(url, cookies=session_of(person)).status_code == 200, person
    teammate = make_user("amy", unit=cast.org.team_a)
    for person in (teammate, cast.ben, cast.zed):
        assert httpx.get(url, cookies=session_of(person)).status_code == 404, person


def test_without_a_session_the_browser_is_sent_to_sign_in(proxy, cast, lab):
    job, _ = lab
    answer = httpx.get(f"{proxy}/notebooks/{job.pk}/lab/")
    assert answer.status_code == 302 and answer.headers["location"].endswith(f"/login/?next=/notebooks/{job.pk}/open")
    assert httpx.post(f"{proxy}/notebooks/{job.pk}/lab/api/kernels").status_code == 401


def test_a_kernel_runs_code_over_the_proxied_websocket(proxy, cast, lab):
    job, _ = lab
    cookies = session_of(cast.ann)
    base = f"{proxy}/notebooks/{job.pk}/lab/"
    kernel = httpx.post(base + "api/kernels", json={"name": "python3"}, cookies=cookies, headers={"Origin": proxy}, timeout=60)
    assert kernel.status_code == 201, kernel.text
    ws = base.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    headers = {"Cookie": f"sessionid={cookies['sessionid']}", "Origin": proxy}
    assert run_async(execute(ws, "print(6 * 7)", headers=headers)) == "42\n"
    # JupyterLab 4 asks for the v1 kernel protocol; the proxy passes the node's choice back.
    import websockets

    async def negotiated() -> str | None:
        async with websockets.connect(ws, additional_headers=headers, subprotocols=["v1.kernel.websocket.jupyter.org"]) as s:  # type: ignore[list-item]
            return s.subprotocol

    assert run_async(negotiated()) == "v1.kernel.websocket.jupyter.org"


def test_another_site_can_neither_post_nor_open_a_websocket_with_the_session(proxy, cast, lab):
    job, _ = lab
    cookies = session_of(cast.ann)
    base = f"{proxy}/notebooks/{job.pk}/lab/"
    evil = {"Origin": "https://evil.example"}
    assert httpx.post(base + "api/kernels", json={"name": "python3"}, cookies=cookies, headers=evil).status_code == 403
    kernel = httpx.post(base + "api/kernels", json={"name": "python3"}, cookies=cookies, headers={"Origin": proxy}, timeout=60)
    ws = base.replace("http://", "ws://") + f"api/kernels/{kernel.json()['id']}/channels"
    import websockets

    async def opens() -> bool:
        try:
            async with websockets.connect(ws, additional_headers={"Cookie": f"sessionid={cookies['sessionid']}", **evil}):
                return True
        except websockets.InvalidStatus as exc:
            assert exc.response.status_code == 403
            return False

    assert run_async(opens()) is False


def test_a_stopped_notebook_is_cut_off_and_the_api_gives_no_url(proxy, cast, lab):
    job, _ = lab
    cookies = session_of(cast.ann)
    assert httpx.get(f"{proxy}/notebooks/{job.pk}/lab/api/status", cookies=cookies).status_code == 200
    client = Client()
    client.force_login(cast.ann)
    assert client.get(f"/api/v1/notebooks/{job.pk}").json()["notebook_url"] == f"{proxy}/notebooks/{job.pk}/lab/"
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    assert httpx.get(f"{proxy}/notebooks/{job.pk}/lab/api/status", cookies=cookies).status_code == 404
    assert client.get(f"/api/v1/notebooks/{job.pk}").json()["notebook_url"] is None


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict[str, str]] = []

    def do_GET(self) -> None:
        _Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "sessionid=planted; Path=/")
        self.send_header("Set-Cookie", "_xsrf=jupyters-own; Path=/")
        self.send_header("Location", f"http://127.0.0.1:{self.server.server_port}/notebooks/1/lab/tree")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_portals_cookies_never_reach_the_node_and_the_node_cannot_set_them(proxy, cast):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        upstream = f"http://127.0.0.1:{server.server_port}/notebooks/1/lab/?token=node-secret"
        job = running_notebook(team=cast.org.team_a, user=cast.ann, url=upstream)
        cookies = {**session_of(cast.ann), "csrftoken": "portal-csrf", "_xsrf": "jupyter-xsrf"}
        answer = httpx.get(f"{proxy}/notebooks/{job.pk}/lab/x", cookies=cookies, headers={"Authorization": "Bearer ym_mine"})
    finally:
        server.shutdown()
    seen = _Recorder.seen[-1]
    assert seen["authorization"] == "token node-secret"
    assert "sessionid" not in seen.get("cookie", "") and "csrftoken" not in seen.get("cookie", "")
    assert "_xsrf=jupyter-xsrf" in seen["cookie"]
    assert [c for c in answer.headers.get_list("set-cookie") if c.startswith("sessionid")] == []
    assert answer.headers["location"] == "/notebooks/1/lab/tree"  # the node's address stays out of the browser


def test_the_wsgi_tier_sends_a_stray_notebook_request_to_the_proxy(cast, settings):
    settings.YARD_NOTEBOOK_URL = "http://127.0.0.1:8001"
    client = Client()
    client.force_login(cast.ann)
    answer = client.get("/notebooks/7/lab/tree?x=1")
    assert answer.status_code == 302 and answer["Location"] == "http://127.0.0.1:8001/notebooks/7/lab/tree?x=1"
    settings.YARD_NOTEBOOK_URL = ""
    misrouted = client.get("/notebooks/7/lab/")
    assert misrouted.status_code == 502 and b"route /notebooks/<id>/lab/" in misrouted.content
