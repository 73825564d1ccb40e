"""An assembled connector + reference host + console, driven in-process over httpx."""

from __future__ import annotations

import re
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from fastapi import APIRouter

from connector.api.console import console_router
from connector.assembly import Assembled, ConnectorConfig, assemble
from connector.host.service import HostService
from connector.service.answers import Accepted
from connector.timer import VirtualTimer
from providers.replay import ReplayProvider
from tests.e2e.serve_process import add_test_principals
from tests.support.clocks import OffsetClock
from tests.support.directives import HEART_RATE, scan_directive
from tests.support.fixtures import write_fixture
from tests.support.paths import REPO
from tests.support.principals import Tokens

BASE_URL = "http://127.0.0.1:8787"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@dataclass(frozen=True, slots=True)
class BleCanaries:
    """Strings planted in the BLE fixture of the console tests."""

    name: str
    payload_hex: str
    address: str

    @classmethod
    def fresh(cls) -> BleCanaries:
        mac = ":".join(f"{b:02X}" for b in secrets.token_bytes(6))
        return cls(f"CANARYconsole{secrets.token_hex(8)}", secrets.token_bytes(12).hex(), mac)

    def all(self) -> tuple[str, ...]:
        return (self.name, self.payload_hex, self.address)


def ble_fixture(path: Path, canaries: BleCanaries) -> Path:
    """A strap advertising every 200 ms for 60 s."""
    lines = [
        {
            "t_ms": 10 + step * 200,
            "address": canaries.address,
            "name": canaries.name,
            "rssi": -60,
            "service_uuids": [HEART_RATE],
            "manufacturer_data": {"65535": canaries.payload_hex},
            "connectable": True,
        }
        for step in range(300)
    ]
    return write_fixture(path, "ble", lines)


@dataclass(slots=True)
class Console:
    """Everything a console test needs."""

    client: httpx.AsyncClient
    host: HostService
    tokens: Tokens
    canaries: BleCanaries
    clock: OffsetClock
    data_dir: Path
    timer: VirtualTimer

    async def step(self, *, by_ms: int | None = None) -> None:
        """Advance the runtime's virtual clock to its next due moment, due by `by_ms` (now + 10 s)."""
        by_ms = self.timer.now_ms() + 10_000 if by_ms is None else by_ms
        due_ms = self.timer.next_due_ms()
        assert due_ms is not None and due_ms <= by_ms, f"nothing due by {by_ms} (next {due_ms})"
        await self.timer.advance_to(due_ms)

    async def start_scan(self, window_seconds: int = 60) -> str:
        """A caller starts a BLE scan through the host (as `POST /v1/host/directives` would)."""
        directive = scan_directive(window_seconds)
        answer = await self.host.admit(self.host.authenticate(self.tokens.caller), directive)
        assert isinstance(answer, Accepted)
        return str(answer.handle["operation/id"])

    async def caller_status(self, op_id: str, **kwargs: Any) -> dict[str, Any]:
        """The owning caller's live status through the host."""
        return dict(
            (await self.host.status(self.host.authenticate(self.tokens.caller), op_id, **kwargs)).document
        )

    async def sign_in(self, token: str | None = None) -> httpx.Response:
        """Fetch the form, then post the token with its nonce; returns the POST's response."""
        form = await self.client.get("/admin/sign-in")
        return await self.client.post(
            "/admin/sign-in",
            data={"csrf_token": csrf_of(form.text), "token": token or self.tokens.operator},
        )

    async def csrf(self, path: str) -> str:
        """The CSRF token on a signed-in page."""
        page = await self.client.get(path)
        assert page.status_code == 200, page.status_code
        return csrf_of(page.text)


def csrf_of(html: str) -> str:
    """The first CSRF/nonce hidden field of a page."""
    found = _CSRF.search(html)
    assert found, "no csrf field"
    return found.group(1)


@asynccontextmanager
async def console_harness(tmp_path: Path) -> AsyncIterator[Console]:
    """Connector, host and console over one data dir, with a canary BLE fixture (no background poller).

    The runtime and the replay run on a `VirtualTimer`; the console's own sessions on a shifted wall clock.
    """
    data_dir = tmp_path / "data"
    tokens = add_test_principals(data_dir)
    canaries = BleCanaries.fresh()
    config = ConnectorConfig(
        data_dir=data_dir,
        catalog=REPO / "catalog/actions.json",
        trust_dir=REPO / "catalog/trust",
        replay={"ble": ble_fixture(tmp_path / "ble.jsonl", canaries)},
        host_poller=False,
    )
    clock = OffsetClock()
    timer = VirtualTimer()
    replay = ReplayProvider(config.replay["ble"], speed=config.replay_speed, timer=timer)

    def routers(assembled: Assembled) -> list[APIRouter]:
        return [console_router(assembled.host, authenticate=assembled.service.authenticate, clock=clock)]

    async with assemble(config, routers=routers, providers=lambda _t, _a: replay, timer=timer) as assembled:
        transport = httpx.ASGITransport(app=assembled.app)
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
            yield Console(client, assembled.host, tokens, canaries, clock, data_dir, timer)
