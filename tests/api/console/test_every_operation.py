"""The console lists the connector's own operations too, and `/admin/adapters` shows each claim (in-process).

A scan admitted on `POST /v1/directives` never reaches the host registry; the console still lists it (via
`connector`), filters it by status, and opens it read-only. The adapters page shows the default adapter of
every scannable transport as free, a running scan as "in use", and an unacknowledged stop as "held by an
uncertain cleanup" with its next retry, until a later acknowledgement frees it.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter

from connector.api.console import console_router
from connector.assembly import Assembled, ConnectorConfig, assemble
from connector.cli.serve_cmd import known_adapters
from connector.service.answers import Accepted
from connector.service.operations import LiveConnectorOperations
from connector.timer import VirtualTimer
from tests.api.console.conftest import BASE_URL, csrf_of
from tests.e2e.serve_process import add_test_principals
from tests.runtime.sessions import metadata_of
from tests.support.directives import HEART_RATE, scan_directive
from tests.support.paths import REPO
from tests.support.principals import Tokens

LIST = "/admin/deferred-operations"


@asynccontextmanager
async def harness(
    tmp_path: Path, timer: VirtualTimer
) -> AsyncIterator[tuple[Assembled, httpx.AsyncClient, Tokens]]:
    tokens = add_test_principals(tmp_path / "data")
    config = ConnectorConfig(
        data_dir=tmp_path / "data",
        catalog=REPO / "catalog/actions.json",
        trust_dir=REPO / "catalog/trust",
        simulate=("ble", "usb-serial", "mdns"),
        host_poller=False,
    )

    def routers(assembled: Assembled) -> list[APIRouter]:
        operations = LiveConnectorOperations(
            assembled.discovery, assembled.state, known_adapters=known_adapters(assembled)
        )
        return [
            console_router(assembled.host, authenticate=assembled.service.authenticate, operations=operations)
        ]

    async with assemble(config, routers=routers, timer=timer) as assembled:
        transport = httpx.ASGITransport(app=assembled.app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            form = await client.get("/admin/sign-in")
            signed = await client.post(
                "/admin/sign-in", data={"csrf_token": csrf_of(form.text), "token": tokens.operator}
            )
            assert signed.status_code == 303
            yield assembled, client, tokens


async def _admit(assembled: Assembled, tokens: Tokens, transport: str, filters: dict[str, Any]) -> str:
    principal = assembled.service.authenticate(tokens.caller)
    directive = scan_directive(30, transport=transport, filters=filters)
    answer = await assembled.service.invoke(principal, directive)
    assert isinstance(answer, Accepted)
    return str(answer.handle["connector_operation/id"])


async def _until(timer: VirtualTimer, check: Any, within_ms: int = 15_000) -> None:
    """Advance the virtual clock from due moment to due moment until `check()` holds, by `within_ms`."""
    by_ms = timer.now_ms() + within_ms
    await timer.advance(0)
    while not await check():
        due_ms = timer.next_due_ms()
        assert due_ms is not None and due_ms <= by_ms, f"nothing due by {by_ms} (next {due_ms})"
        await timer.advance_to(due_ms)


def _plain(html: str) -> str:
    return html.replace("<wbr>", "")


@pytest.mark.asyncio
async def test_connector_route_scans_are_listed_filtered_and_shown_read_only(tmp_path: Path) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, timer) as (assembled, client, tokens):
        empty = await client.get(LIST)
        assert 'id="no-operations"' in empty.text and "POST /v1/directives" in empty.text
        assert 'http-equiv="refresh"' not in empty.text
        op_id = await _admit(assembled, tokens, "ble", {"service_uuids": [HEART_RATE]})

        async def running() -> bool:
            return bool(metadata_of(assembled.discovery, op_id)["status"] == "running")

        await _until(timer, running)
        listing = await client.get(LIST)
        row = re.search(r'<tr data-status="running">(.*?)</tr>', listing.text, re.S)
        assert row is not None and op_id in _plain(row.group(1))
        cells = re.findall(r'data-label="(\w+)">(.*?)</td>', row.group(1), re.S)
        facts = {label: re.sub(r"<[^>]+>", "", value).strip() for label, value in cells}
        assert facts["Transport"] == "ble" and facts["Window"] == "30 s" and facts["Adapter"] == "default"
        assert facts["Via"] == "connector" and facts["Action"] == "device.discovery.scan"
        assert 'http-equiv="refresh" content="5"' in listing.text
        assert op_id in _plain((await client.get(LIST, params={"status": "running"})).text)
        assert op_id not in _plain((await client.get(LIST, params={"status": "completed"})).text)
        detail = await client.get(f"{LIST}/{op_id.replace(':', '%3A')}")
        assert detail.status_code == 200 and 'id="connector-only"' in detail.text
        assert 'id="poll-now"' not in detail.text and 'id="cancel"' in detail.text
        assert 'http-equiv="refresh" content="2"' in detail.text
        assert "Candidates delivered to the caller" in detail.text
        unknown = await client.get(f"{LIST}/deferred%3Asensorium.directive.invoke%3A" + "A" * 26)
        assert unknown.status_code == 404


@pytest.mark.asyncio
async def test_the_adapters_page_shows_free_in_use_and_held_claims(tmp_path: Path) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, timer) as (assembled, client, tokens):
        page = (await client.get("/admin/adapters")).text
        rows = dict(
            re.findall(
                r'<tr data-state="([a-z-]+)">\s*<td class="mono" data-label="Transport">([a-z-]+)', page
            )
        )
        assert sorted(re.findall(r'data-label="Transport">([a-z-]+)<', page)) == ["ble", "mdns", "usb-serial"]
        assert set(rows) == {"free"} and 'http-equiv="refresh"' not in page
        simulation = assembled.simulation
        assert simulation is not None
        ble = simulation.adapter("ble")
        assert ble is not None
        op_id = await _admit(assembled, tokens, "ble", {"service_uuids": [HEART_RATE]})

        async def in_use() -> bool:
            return "in use by 1 session(s)" in (await client.get("/admin/adapters")).text

        await _until(timer, in_use)
        ble.gate.mode = "refuse"
        await assembled.service.cancel(assembled.service.authenticate(tokens.caller), op_id)

        async def held() -> bool:
            return "held by 1 uncertain cleanup(s)" in (await client.get("/admin/adapters")).text

        await _until(timer, held)
        page = (await client.get("/admin/adapters")).text
        assert op_id in _plain(page) and "next retry" in page and 'http-equiv="refresh"' in page
        ble.gate.mode = "ack"

        async def freed() -> bool:
            return "uncertain cleanup(s)" not in (await client.get("/admin/adapters")).text

        await _until(timer, freed, within_ms=30_000)
        status = metadata_of(assembled.discovery, op_id)
        assert status["status"] == "failed" and status["cleanup"] == {
            "state": "confirmed",
            "claim": "released",
        }


@pytest.mark.asyncio
async def test_the_adapters_page_needs_an_operator_session(tmp_path: Path) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, timer) as (_, client, _tokens):
        client.cookies.clear()
        response = await client.get("/admin/adapters")
        assert response.status_code == 303 and response.headers["location"] == "/admin/sign-in"


@pytest.mark.asyncio
async def test_an_operator_cancels_a_connector_route_scan_from_the_console(tmp_path: Path) -> None:
    timer = VirtualTimer()
    async with harness(tmp_path, timer) as (assembled, client, tokens):
        op_id = await _admit(assembled, tokens, "ble", {"service_uuids": [HEART_RATE]})

        async def running() -> bool:
            return bool(metadata_of(assembled.discovery, op_id)["status"] == "running")

        await _until(timer, running)
        path = f"{LIST}/{op_id.replace(':', '%3A')}"
        detail = await client.get(path)
        assert 'id="cancel"' in detail.text and 'id="cancel" disabled' not in detail.text
        cancelled = await client.post(f"{path}/cancel", data={"csrf_token": csrf_of(detail.text)})
        assert cancelled.status_code == 303

        async def ended() -> bool:
            return bool(metadata_of(assembled.discovery, op_id)["status"] == "cancelled")

        await _until(timer, ended)
        after = await client.get(path)
        assert "Cancel requested; the host answered" in after.text
        assert "no: the operation has ended" in after.text and 'id="cancel" disabled' in after.text
