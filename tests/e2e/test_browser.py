"""The console in a real browser: Debian's headless Chromium (Playwright, `executable_path`) against `serve`.

JavaScript is switched off in the browser context: the console must be usable without it. Every request the
page makes must go to the server under test, and `--host-resolver-rules` keeps Chromium off the network.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.api.console.conftest import BleCanaries, ble_fixture
from tests.e2e.serve_process import add_test_principals, host_status, replay_serving, start_host_scan
from tests.support.directives import scan_directive
from tests.support.paths import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
]
SCREENSHOT = REPO / "test-artifacts" / "console.png"

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
    pytest.mark.browser,
    pytest.mark.serve,
]


def wait_running_with_candidates(client: httpx.Client, op_id: str, timeout: float = 15.0) -> None:
    """Until the owning caller has seen the scan running with its canary candidate."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = host_status(client, op_id)
        if status["status"] == "running" and status.get("progress", {}).get("snapshot", {}).get("candidates"):
            return
        time.sleep(0.1)  # real peer: the serve process runs the scan
    raise AssertionError("the scan did not show a candidate while running")


@pytest.mark.timeout(120)
def test_sign_in_list_open_cancel_and_watch_it_end_cancelled(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    canaries = BleCanaries.fresh()
    data_dir = tmp_path / "data"
    tokens = add_test_principals(data_dir)
    fixture = ble_fixture(tmp_path / "ble.jsonl", canaries)
    with replay_serving(data_dir, tmp_path / "logs", name="browser", replays={"ble": fixture}) as server:
        with server.client(tokens.caller) as caller:
            directive = scan_directive(60)
            op_id = start_host_scan(caller, directive)
            wait_running_with_candidates(caller, op_id)
        base = server.base_url
        requested: list[str] = []
        pages: list[str] = []
        with sync_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(tmp_path / "profile"),  # a new, empty user-data-dir
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
                java_script_enabled=False,
            )
            try:
                page = context.pages[0] if context.pages else context.new_page()
                page.on("request", lambda request: requested.append(request.url))

                page.goto(f"{base}/admin/deferred-operations")
                assert page.url == f"{base}/admin/sign-in"
                pages.append(page.content())

                page.fill("#token", tokens.operator)
                page.click("#sign-in")
                assert page.url == f"{base}/admin/deferred-operations"
                cookie = next(c for c in context.cookies() if c["name"] == "sensorium_console")
                assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/admin"
                assert not cookie["secure"]
                link = page.locator("#operations a", has_text=op_id)
                assert link.count() == 1
                pages.append(page.content())

                page.select_option("#status", "running")
                page.click("#filter")
                assert page.url == f"{base}/admin/deferred-operations?status=running"
                page.locator("#operations a", has_text=op_id).click()
                assert page.inner_text("#operation-id") == op_id
                assert page.inner_text("#status") == "running"
                assert page.inner_text("#cancelability") == "yes"
                pages.append(page.content())

                page.click("#cancel")
                assert "cancellation requested" in page.inner_text("#notice")
                pages.append(page.content())
                seen = [page.inner_text("#status")]
                deadline = time.monotonic() + 20
                while seen[-1] != "cancelled" and time.monotonic() < deadline:
                    time.sleep(0.2)  # real peer: the serve process confirms the cancel
                    page.click("#reload")
                    seen.append(page.inner_text("#status"))
                assert seen[-1] == "cancelled", seen
                assert set(seen) <= {"running, cancellation requested", "cancelled"}, seen
                assert "cancellation confirmed at" in page.inner_text("#cancellation")
                assert page.is_disabled("#cancel") and page.is_disabled("#poll-now")
                pages.append(page.content())
                SCREENSHOT.parent.mkdir(exist_ok=True)
                page.screenshot(path=str(SCREENSHOT), full_page=True)

                page.click("#sign-out")
                assert page.url == f"{base}/admin/sign-in"
                page.goto(f"{base}/admin/deferred-operations")
                assert page.url == f"{base}/admin/sign-in"
            finally:
                context.close()
    assert SCREENSHOT.stat().st_size > 0
    assert requested and all(url.startswith(base + "/") for url in requested), requested
    for html in pages:
        for canary in canaries.all():
            assert canary not in html
        assert tokens.operator not in html and tokens.caller not in html
