"""An inference service in a real browser: created through the form, followed to ready on its page (real agents
on simulated GPUs run a small HTTP server and probe it), then scaled to two replicas."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from django.db import connection
from playwright.sync_api import Page, expect

from scheduling.models import Service
from scheduling.serving.controller import reconcile, reconcile_all
from scheduling.serving.services import ServiceSpec, service_create
from tests.browser.conftest import Cluster, People, screenshot, sign_in
from tests.e2e.conftest import script
from tests.factories import make_cluster

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SERVER = """
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_GET(self):
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

port = int(os.environ["PORT"])
print(f"serving on {port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""
WAIT_MS = 60_000
CONTROLLER_EVERY_S = 0.5


@pytest.fixture
def controller(cluster: Cluster) -> Iterator[None]:
    """The service controller on its beat, as Celery beat would run it (the cluster fixture runs the cycle)."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.wait(CONTROLLER_EVERY_S):
                reconcile_all()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=loop, name="service-controller", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors, errors


def test_create_a_service_through_the_form_follow_it_to_ready_and_scale_it(
    page: Page, live_server, cluster: Cluster, people: People, controller: None
):
    sign_in(page, live_server.url, "ann")
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Services", exact=True).click()
    page.get_by_role("link", name="New service").click()
    expect(page.get_by_label("Tier:", exact=True)).to_have_value("1")
    page.get_by_label("Name:", exact=True).fill("echo")
    page.get_by_label("Command:", exact=True).fill(script(cluster.root, "serve", SERVER))
    page.get_by_label("Readiness path:", exact=True).fill("/health")
    screenshot(page, "service-new")
    page.get_by_role("button", name="Create service").click()

    service = Service.objects.get(name="echo")
    page.wait_for_url(f"{live_server.url}/services/{service.pk}/")
    expect(page.locator("#endpoint-url")).to_have_text(f"{live_server.url}/services/team-a/echo/")
    expect(page.locator("#service-ready")).to_have_text("1 / 1 ready", timeout=WAIT_MS)
    expect(page.locator("#rollout-state")).to_have_text("complete", timeout=WAIT_MS)
    expect(page.locator("tr.replica .badge")).to_have_text(["ready"])

    page.get_by_label("Replicas:", exact=True).fill("2")
    page.get_by_role("button", name="Scale", exact=True).click()
    expect(page.get_by_role("status").filter(has_text="Scaled echo to 2 replicas")).to_be_visible()
    expect(page.locator("#service-ready")).to_have_text("2 / 2 ready", timeout=WAIT_MS)
    expect(page.locator("tr.replica .badge")).to_have_text(["ready", "ready"])
    screenshot(page, "service")

    page.get_by_role("navigation", name="Main").get_by_role("link", name="Services", exact=True).click()
    expect(page.locator(f'tr[data-service="{service.pk}"] .replicas')).to_have_text("2 / 2")
    screenshot(page, "services")


def test_the_services_pages_fit_a_390_px_screen(browser, live_server, people: People):
    make_cluster(nodes=2)  # nodes in the database only, and no cycle: its replica is shown waiting
    name = "a-service-with-a-rather-long-name-for-a-phone"
    spec = ServiceSpec(name=name, team=people.org.team_a, gpu_type="H100", command="serve")
    service = service_create(user=people.ann, spec=spec)
    reconcile(service_id=service.pk)
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    phone = context.new_page()
    try:
        sign_in(phone, live_server.url, "ann")
        for path in ("/services/", "/services/new", f"/services/{service.pk}/"):
            phone.goto(f"{live_server.url}{path}")
            widths = phone.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
            assert widths[0] <= widths[1] == 390, f"{path} is {widths[0]} px wide on a 390 px screen"
        screenshot(phone, "service-phone")
    finally:
        context.close()
