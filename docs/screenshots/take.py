"""Retake the screenshots of docs/screenshots/ against a running demo (`make run`, seeded with its month of
history), in Debian's Chromium:

    make run &                                        # or: YARD_VAR_DIR=/tmp/demo bash scripts/run-demo.sh --bind 127.0.0.1:8123
    .venv/bin/python docs/screenshots/take.py http://127.0.0.1:8000

It submits two jobs as alice (a two-node one that runs, one that waits on her team's quota) and a notebook,
then takes each page at 1366 x 860 (and the dashboard at 390 x 844, a phone).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from playwright.sync_api import Page, expect, sync_playwright

OUT = Path(__file__).resolve().parent
PASSWORD = "yardmaster-demo"


def sign_in(page: Page, base: str, user: str) -> None:
    page.context.clear_cookies()
    page.goto(f"{base}/login/")
    page.get_by_label("Username").fill(user)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(f"{base}/")


def shot(page: Page, name: str, *, full: bool = True) -> None:
    page.wait_for_timeout(600)
    page.screenshot(path=str(OUT / f"{name}.png"), full_page=full)
    print("wrote", OUT / f"{name}.png")


def submit(page: Page, base: str, *, name: str, replicas: int, gpus: int, command: str, hours: str = "4") -> str:
    page.goto(f"{base}/jobs/new/")
    page.get_by_label("Name:", exact=True).fill(name)
    page.get_by_label("Replicas:", exact=True).fill(str(replicas))
    page.get_by_label("GPUs per replica:", exact=True).fill(str(gpus))
    page.get_by_label("Time limit (hours):", exact=True).fill(hours)
    page.get_by_label("Command:", exact=True).fill(command)
    expect(page.locator("#preview .verdict[data-ok]")).to_be_visible(timeout=20_000)
    return page.locator("#preview").inner_text()


def main(base: str) -> None:
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_context(viewport={"width": 1366, "height": 860}).new_page()
        sign_in(page, base, "alice")
        train = "python -c 'import time; [print(\"step\", i, flush=True) or time.sleep(2) for i in range(900)]'"
        submit(page, base, name="llm-7b-finetune", replicas=2, gpus=8, command=train)
        shot(page, "submit")
        page.get_by_role("button", name="Submit job").click()
        expect(page.locator("#job-state")).to_have_text("Running", timeout=60_000)
        expect(page.locator("#log")).to_contain_text("step 3", timeout=60_000)
        shot(page, "job")
        # A big one that waits for pretraining's quota (limit 200 H100): the wait says until when.
        submit(page, base, name="llm-70b-pretrain", replicas=24, gpus=8, command=train, hours="24")
        page.get_by_role("button", name="Submit job").click()
        big = page.url
        submit(page, base, name="llm-13b-sweep", replicas=8, gpus=8, command=train, hours="12")
        page.get_by_role("button", name="Submit job").click()
        time.sleep(4)
        page.goto(page.url)
        shot(page, "job-waiting")
        page.goto(big)
        time.sleep(2)
        shot(page, "job-big-gang")
        page.goto(f"{base}/notebooks/")
        page.get_by_role("button", name="Launch notebook").click()
        expect(page.locator("#notebook-activity")).to_be_visible(timeout=60_000)
        shot(page, "notebook")
        page.goto(f"{base}/")
        shot(page, "dashboard")
        page.goto(f"{base}/fairshare/")
        shot(page, "fairshare")
        page.goto(f"{base}/cluster/")
        expect(page.locator(".gpu.busy").first).to_be_visible(timeout=30_000)
        shot(page, "cluster")
        page.goto(f"{base}/api/docs/")
        expect(page.locator(".swagger-ui .info .title")).to_be_visible(timeout=20_000)
        shot(page, "api-docs", full=False)

        sign_in(page, base, "rita")
        page.goto(f"{base}/quotas/")
        shot(page, "quotas")
        sign_in(page, base, "admin")
        page.goto(f"{base}/reports/")
        shot(page, "report")

        phone = browser.new_context(viewport={"width": 390, "height": 844}).new_page()
        sign_in(phone, base, "alice")
        shot(phone, "dashboard-phone")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
