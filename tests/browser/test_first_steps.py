"""What a new user meets first, in real Chromium: every page fits a 390 px phone, the API docs render with
no request leaving the machine."""

from __future__ import annotations

from urllib.parse import urlparse

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import People, screenshot, sign_in
from tests.factories import make_job

pytestmark = [pytest.mark.browser]

PAGES = [
    "/",
    "/jobs/",
    "/jobs/new/",
    "/notebooks/",
    "/dev-sessions/",
    "/dev-sessions/new",
    "/cluster/",
    "/quotas/",
    "/fairshare/",
]
PAGES += ["/reports/", "/tokens/", "/ssh-keys/"]


@pytest.fixture
def phone(browser) -> Page:
    context = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=1)
    page = context.new_page()
    yield page
    context.close()


def test_every_page_fits_a_390_px_screen_with_the_nav_on_its_dark_bar(phone: Page, live_server, people: People):
    job = make_job(team=people.org.team_a, user=people.oli, name="a-job-with-a-rather-long-name-for-a-phone-screen")
    sign_in(phone, live_server.url, "oli")
    for path in [*PAGES, f"/jobs/{job.pk}/"]:
        phone.goto(f"{live_server.url}{path}")
        widths = phone.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
        assert widths[0] <= widths[1] == 390, f"{path} is {widths[0]} px wide on a 390 px screen"
        bar = phone.locator("header.topbar").bounding_box()
        assert bar is not None
        for link in phone.get_by_role("navigation", name="Main").get_by_role("link").all():
            box = link.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, f"{path}: a nav link is off screen"
            assert bar["y"] <= box["y"] and box["y"] + box["height"] <= bar["y"] + bar["height"], (
                f"{path}: a nav link is outside the dark top bar"
            )
    phone.goto(f"{live_server.url}/")
    screenshot(phone, "dashboard-phone")


def test_the_api_docs_render_with_no_request_leaving_the_machine(page: Page, live_server, people: People):
    ours = urlparse(live_server.url).netloc
    outside: list[str] = []

    def only_ours(route) -> None:
        if urlparse(route.request.url).netloc == ours:
            route.continue_()
        else:  # an air-gapped cluster: nothing else answers
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_ours)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    sign_in(page, live_server.url, "ann")
    page.goto(f"{live_server.url}/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Yardmaster API", timeout=20_000)
    expect(page.locator(".opblock-tag-section").first).to_be_visible()
    assert outside == [] and errors == []
    screenshot(page, "api-docs")
