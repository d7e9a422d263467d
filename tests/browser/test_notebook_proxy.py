"""In real Chromium: a notebook opened through the portal's notebook proxy, JupyterLab loaded through it,
and a real kernel running code over the proxied websocket; and every page under the portal's
Content-Security-Policy without a violation."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from portal import notebook_proxy
from tests.browser.conftest import Cluster, People, screenshot, sign_in
from tests.portal.notebook_servers import proxy_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]
POLL_MS = 60_000

# The kernel exchange JupyterLab's own code makes, run in the page: a kernel over the REST API, then an
# execute_request on its websocket (both through the proxy, with the page's session cookie only).
KERNEL_EXCHANGE = """
async (base) => {
  const xsrf = (document.cookie.match(/_xsrf=([^;]+)/) || [])[1];
  const headers = {"Content-Type": "application/json", ...(xsrf ? {"X-XSRFToken": xsrf} : {})};
  const made = await fetch(base + "api/kernels", {method: "POST", headers, body: JSON.stringify({name: "python3"})});
  if (made.status !== 201) return "kernel: HTTP " + made.status;
  const kernel = await made.json();
  const url = base.replace(/^http/, "ws") + "api/kernels/" + kernel.id + "/channels";
  return await new Promise((resolve) => {
    const socket = new WebSocket(url);
    const id = crypto.randomUUID();
    let printed = "";
    socket.onerror = () => resolve("websocket error");
    socket.onopen = () => socket.send(JSON.stringify({
      header: {msg_id: id, username: "ann", session: crypto.randomUUID(), msg_type: "execute_request", version: "5.3"},
      parent_header: {}, metadata: {}, channel: "shell", buffers: [],
      content: {code: "import os; print(6 * 7, os.environ.get('JUPYTER_TOKEN') is not None)", silent: false,
                store_history: false, user_expressions: {}, allow_stdin: false},
    }));
    socket.onmessage = (event) => {
      const reply = JSON.parse(event.data);
      if (!reply.parent_header || reply.parent_header.msg_id !== id) return;
      if (reply.msg_type === "stream") printed += reply.content.text;
      if (reply.msg_type === "status" && reply.content.execution_state === "idle") { socket.close(); resolve(printed); }
    };
  });
}
"""


@pytest.fixture
def proxy(live_server: Any, settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
    settings.YARD_NOTIFY = {**settings.YARD_NOTIFY, "PUBLIC_URL": live_server.url}
    monkeypatch.setattr(notebook_proxy, "AUTH_CACHE_S", 0.5)
    # "localhost", as the live server: the browser sends the portal's session cookie to the proxy's port too.
    with proxy_server(name="localhost") as url:
        settings.YARD_NOTEBOOK_URL = url
        yield url


def test_a_notebook_opens_through_the_portal_and_its_kernel_runs_code(
    page: Page, live_server: Any, cluster: Cluster, people: People, proxy: str
) -> None:
    sign_in(page, live_server.url, "ann")
    page.goto(f"{live_server.url}/notebooks/")
    page.get_by_label("GPUs:", exact=True).fill("1")
    page.get_by_role("button", name="Launch notebook").click()
    expect(page.locator("#open-notebook")).to_be_visible(timeout=POLL_MS)
    job_id = re.search(r"/notebooks/(\d+)/", page.url).group(1)  # type: ignore[union-attr]

    with page.context.expect_page() as opened:
        page.locator("#open-notebook").click()
    lab = opened.value
    lab.wait_for_url(re.compile(rf"^{re.escape(proxy)}/notebooks/{job_id}/lab/"), timeout=POLL_MS)
    # JupyterLab itself, every file of it through the proxy; no token in any URL the browser saw.
    expect(lab.locator(".jp-LabShell")).to_be_visible(timeout=POLL_MS)
    seen: list[str] = []
    lab.on("request", lambda request: seen.append(request.url))
    printed = lab.evaluate(KERNEL_EXCHANGE, f"{proxy}/notebooks/{job_id}/lab/")
    assert printed == "42 True\n", printed  # a real kernel; its server got its token from the environment
    assert "token" not in lab.url and not [u for u in seen if "token=" in u]
    screenshot(lab, "notebook-lab")

    # The same person's browser, signed out: the proxy sends it to sign in.
    lab.context.clear_cookies()
    lab.goto(f"{proxy}/notebooks/{job_id}/lab/")
    lab.wait_for_url(re.compile(r"/login/"), timeout=POLL_MS)
    lab.close()


PAGES = [
    "/",
    "/jobs/",
    "/jobs/new/",
    "/notebooks/",
    "/cluster/",
    "/quotas/",
    "/fairshare/",
    "/tokens/",
    "/reports/",
    "/api/docs/",
]


def test_the_pages_and_htmx_work_under_the_content_security_policy(page: Page, live_server: Any, people: People) -> None:
    violations: list[str] = []
    page.on("console", lambda msg: violations.append(msg.text) if "Content Security Policy" in msg.text else None)
    page.add_init_script(
        "document.addEventListener('securitypolicyviolation', e => console.error("
        "'Content Security Policy violation: ' + e.violatedDirective + ' ' + e.blockedURI))"
    )
    sign_in(page, live_server.url, "ann")
    for path in PAGES:
        response = page.goto(f"{live_server.url}{path}")
        assert response is not None and response.status in (200, 404), path
        assert "script-src 'self'" in (response.headers.get("content-security-policy") or ""), path
    # htmx at work: the submit page's live admission check.
    page.goto(f"{live_server.url}/jobs/new/")
    page.get_by_label("Name:", exact=True).fill("csp-check")
    page.get_by_label("Command:", exact=True).fill("true")
    expect(page.locator("#preview")).not_to_be_empty(timeout=POLL_MS)
    assert violations == [], violations
