"""The console's overview pages in real Chromium at desktop and phone (390 px) widths, on `serve --simulate`.

Scans come in by every route (host, connector), one ends with an uncertain cleanup. The list must tell them
apart (action, transport, window, adapter, status, outcome), pages of running work must refresh themselves,
`/admin/adapters` must show free / in use / held claims, and at 390 px nothing may overflow sideways.
Screenshots are kept in `test-artifacts/`.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from connector.testing import MockConnector, start_connector
from tests.e2e.test_browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.directives import HEART_RATE
from tests.support.paths import REPO

ARTIFACTS = REPO / "test-artifacts"
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}

pytestmark = [
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"),
    pytest.mark.browser,
    pytest.mark.serve,
]


def _host_scan(connector: MockConnector, window: int, correlation_id: str | None = None) -> str:
    directive: dict[str, Any] = {
        "schema": "sensorium-directive.v1",
        "action_id": "device.discovery.scan",
        "timing": {"mode": "async", "status_versions": [2]},
        "input": {"transport": "ble", "window_seconds": window, "filters": {"service_uuids": [HEART_RATE]}},
    }
    if correlation_id is not None:
        directive["correlation/id"] = correlation_id
    headers = {"Authorization": f"Bearer {connector.caller_token}"}
    answer = httpx.post(connector.base_url + "/v1/host/directives", json=directive, headers=headers)
    assert answer.status_code == 202, answer.text
    return str(answer.json()["operation/id"])


def _overflows(page: Any) -> bool:
    return bool(page.evaluate("document.documentElement.scrollWidth > document.documentElement.clientWidth"))


def _status_becomes(page: Any, wanted: str, timeout: float) -> bool:
    """Watch the page (which reloads itself) until its status badge reads `wanted`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if page.inner_text("#status", timeout=2000) == wanted:
                return True
        except Exception:  # the page was reloading at that moment
            pass
        time.sleep(0.25)  # real peer: the page in the browser reloads itself
    return False


def _shoot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)
    assert (ARTIFACTS / name).stat().st_size > 0


@pytest.mark.timeout(180)
def test_every_route_listed_self_refreshing_adapters_and_phone_layout(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    canary = "CANARYbrowser" + secrets.token_hex(6)
    with start_connector(tmp_path) as connector:
        connector.sim("ble").add_device(
            {"address": "C0:FF:EE:00:00:01", "rssi": -55, "name": canary, "service_uuids": [HEART_RATE]}
        )
        host_op = _host_scan(connector, 10)
        caller = connector.caller()
        mdns_op = caller.scan("mdns", 40, {"service_types": ["_ipp._tcp"]})
        usb = connector.sim("usb-serial")
        usb.adapter(stop="refuse")
        usb_op = caller.scan("usb-serial", 40, {"vid_pid": [{"vid": 0x2341, "pid": 0x0043}]})
        caller.wait_for(usb_op, lambda s: s["status"] == "running")
        caller.cancel(usb_op)
        held = caller.wait_terminal(usb_op)
        assert held["cleanup"] == {"state": "uncertain", "claim": "held"}
        caller.wait_for(host_op, lambda s: s["status"] == "running")  # host ids are connector ids too

        pages: list[str] = []
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                context = browser.new_context(viewport=DESKTOP)
                page = context.new_page()
                page.goto(connector.base_url + "/admin/sign-in")
                page.fill("#token", connector.operator_token)
                page.click("#sign-in")
                rows = page.locator("#operations tbody tr")
                assert rows.count() == 3
                assert not _overflows(page), "no horizontal scroll at 1280 px"
                banner = page.inner_text("#backend-banner")
                assert "ble, mdns, usb-serial are simulated" in banner
                listing = page.inner_text("#operations")
                shown = page.locator("#operations tbody td.id a").first
                assert len(shown.evaluate("a => a.lastChild.textContent")) == 8  # the short id
                assert page.locator("#operations time[title]").count() == 3  # relative, absolute on hover
                titles = {a.get_attribute("title") for a in page.locator("#operations td.id a").all()}
                assert titles == {host_op, mdns_op, usb_op}  # the whole id on hover and in the page
                assert {"ble", "mdns", "usb-serial"} <= set(listing.split())
                assert "cancellation-unconfirmed" in listing and "40 s" in listing and "10 s" in listing
                via = {r.get_attribute("data-status"): r for r in rows.all()}
                assert set(via) >= {"running", "failed"}
                assert page.locator('meta[http-equiv="refresh"]').count() == 1  # running work: refreshes
                pages.append(page.content())
                _shoot(page, "console-list-desktop.png")

                page.goto(f"{connector.base_url}/admin/deferred-operations/{host_op.replace(':', '%3A')}")
                assert page.inner_text("#status") == "running" and page.inner_text("#transport") == "ble"
                assert page.inner_text("#route") == "host"
                scope = "filters: service_uuids: Heart Rate (180d); at most 64 candidates"
                assert page.inner_text("#scope") == scope
                assert page.inner_text("#adapter") == "default" and not _overflows(page)
                # No click, no script: the page refreshes itself until the window ends.
                assert _status_becomes(page, "completed", timeout=30.0)
                assert "Candidates delivered to the caller" in page.inner_text("#facts")
                assert page.inner_text("#cleanup") == "confirmed, claim released"
                pages.append(page.content())
                _shoot(page, "console-detail-desktop.png")

                page.goto(connector.base_url + "/admin/adapters")
                adapters = page.inner_text("#adapters")
                assert "held by 1 uncertain cleanup(s)" in adapters and usb_op in adapters
                assert "next retry" in adapters and "free" in adapters
                assert "in use by 1 session(s)" in adapters  # the mDNS scan
                pages.append(page.content())
                _shoot(page, "console-adapters-desktop.png")

                page.set_viewport_size(PHONE)
                for path, name in (
                    ("/admin/deferred-operations", "console-list-390.png"),
                    (f"/admin/deferred-operations/{usb_op.replace(':', '%3A')}", "console-detail-390.png"),
                    ("/admin/adapters", "console-adapters-390.png"),
                ):
                    page.goto(connector.base_url + path)
                    assert not _overflows(page), path
                    pages.append(page.content())
                    _shoot(page, name)
                connector_only = page.locator("a", has_text="Operations")
                assert connector_only.count() >= 1
                page.goto(f"{connector.base_url}/admin/deferred-operations/{mdns_op.replace(':', '%3A')}")
                assert page.inner_text("#route") == "connector"
                assert page.locator("#connector-only").count() == 1
                assert page.inner_text("#window") == "40 s"
                assert page.locator("#adapter").count() == 0, "mDNS has no adapter to show"
                assert page.inner_text("#cancelability") == "yes"
                context.close()
            finally:
                browser.close()
        usb.adapter(stop="ack")
        assert connector.stop() == 0  # every line is in the log once the process has exited
        logs = connector.logs()
    for html in pages:
        assert canary not in html and "C0:FF:EE:00:00:01" not in html
        assert connector.operator_token not in html
    assert canary not in logs and "C0:FF:EE:00:00:01" not in logs


@pytest.mark.timeout(180)
def test_caller_text_wraps_and_shows_hidden_characters(tmp_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    long_id = "x" * 256
    tricky = "invoice\u202egnp.exe \x1b[31m\x07\x7f"
    with start_connector(tmp_path, simulate=("ble",)) as connector:
        long_op = _host_scan(connector, 5, correlation_id=long_id)
        tricky_op = _host_scan(connector, 5, correlation_id=tricky)
        with sync_api.sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
            )
            try:
                context = browser.new_context(viewport=PHONE)
                page = context.new_page()
                page.goto(connector.base_url + "/admin/sign-in")
                page.fill("#token", connector.operator_token)
                page.click("#sign-in")
                page.goto(f"{connector.base_url}/admin/deferred-operations/{long_op.replace(':', '%3A')}")
                assert page.inner_text("#correlation-id") == long_id
                assert not _overflows(page), "a 256-character id wraps at 390 px"
                _shoot(page, "console-long-id-390.png")
                page.goto(f"{connector.base_url}/admin/deferred-operations/{tricky_op.replace(':', '%3A')}")
                text = page.inner_text("#correlation-id")
                assert "\\u202e" in text and "␛" in text and "␇" in text and "␡" in text
                assert not any(char in text for char in "\u202e\x1b\x07\x7f")
                _shoot(page, "console-hidden-characters-390.png")
                page.set_viewport_size(DESKTOP)
                page.goto(f"{connector.base_url}/admin/deferred-operations/{long_op.replace(':', '%3A')}")
                assert not _overflows(page)
                _shoot(page, "console-long-id-desktop.png")
                context.close()
            finally:
                browser.close()
