"""Helpers for the Bus tests: a signed test catalog, principals, canary fixtures, an in-process connector
with its Bus face, a broker spy, and directive builders."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import anyio
import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from connector.assembly import Assembled, ConnectorConfig, assemble, provider_factory
from connector.bus.client import BusClient
from connector.core.clock import wall_clock
from connector.core.scope import DiscoveryScope
from providers.base import ObservationSink, Provider, ProviderCapabilities, ProviderSession
from tests.support.catalogs import command_action, signed_catalog
from tests.support.directives import HEART_RATE, scan_directive
from tests.support.fixtures import write_fixture
from tests.support.paths import SHIPPED_TRUST
from tests.support.principals import Tokens, create_principals

ENVIRONMENT = "0000181a-0000-1000-8000-00805f9b34fb"
TEST_VID, TEST_PID = 0x1209, 0x0001  # pid.codes test id
HTTP = "_http._tcp.local."
COMPANY = 0xFFFF  # "no company", reserved for tests
SCAN = "device.discovery.scan"
REDACT = "whisper.redaction.prepare"
SLEEP = "test.sleep"
FAIL = "test.fail"
STUBBORN = "test.stubborn"


def write_catalog(directory: Path) -> Path:
    """The example catalog plus async commands (sleep, fail, uncancelable), signed with the test key."""
    sleeps_60 = "import time; time.sleep(60)"  # real peer: the scripted program's own run time
    sleeps_3 = "import time; time.sleep(3)"  # real peer: the scripted program's own run time
    commands = [
        command_action(SLEEP, ["python3", "-c", sleeps_60]),
        command_action(FAIL, ["python3", "-c", "raise SystemExit(3)"]),
        command_action(STUBBORN, ["python3", "-c", sleeps_3], cancel="none"),
    ]
    return signed_catalog(directory, commands)


# ---- canaries ----------------------------------------------------------------------------------------------


def _canary(label: str) -> str:
    return f"CANARY{label}{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class Canaries:
    """Unique strings planted in device data; `ble_name_prefix` is also a scope filter value."""

    ble_name_prefix: str = field(default_factory=lambda: _canary("blepfx"))
    ble_suffix: str = field(default_factory=lambda: secrets.token_hex(6))
    ble_payload: str = field(default_factory=lambda: secrets.token_bytes(14).hex())
    ble_address: str = field(default_factory=lambda: ":".join(f"{b:02X}" for b in secrets.token_bytes(6)))
    ble_decoy: str = field(default_factory=lambda: _canary("decoy"))
    usb_product: str = field(default_factory=lambda: _canary("product"))
    usb_serial: str = field(default_factory=lambda: _canary("serial"))
    usb_maker: str = field(default_factory=lambda: _canary("maker"))
    mdns_instance: str = field(default_factory=lambda: _canary("inst"))
    mdns_txt: str = field(default_factory=lambda: _canary("txt"))
    mdns_server: str = field(default_factory=lambda: _canary("srv").lower() + ".local.")

    @property
    def ble_name(self) -> str:
        """The advertised name: the filter prefix plus a device part."""
        return self.ble_name_prefix + self.ble_suffix

    def device_values(self) -> dict[str, str]:
        """Every value that exists only in the fixtures (never in a request)."""
        names = [n for n in self.__slots__ if n not in ("ble_name_prefix", "ble_suffix")]
        values = {name: getattr(self, name) for name in names}
        values["ble_name"] = self.ble_name
        return values


def needles(values: Mapping[str, str]) -> dict[str, bytes]:
    """Each value, upper-cased, hashed (SHA-256, SHA-1) and base64-encoded: none may appear."""
    found: dict[str, bytes] = {}
    for name, text in values.items():
        raw = text.encode("utf-8")
        found[name] = raw
        found[f"{name}/upper"] = text.upper().encode()
        found[f"{name}/sha256"] = hashlib.sha256(raw).hexdigest().encode()
        found[f"{name}/sha1"] = hashlib.sha1(raw).hexdigest().encode()
        found[f"{name}/base64"] = base64.b64encode(raw).rstrip(b"=")
    return found


def canary_fixtures(directory: Path, c: Canaries) -> dict[str, Path]:
    """One fixture per transport with the canary device seen every 200-1000 ms for 60 s."""
    directory.mkdir(parents=True, exist_ok=True)
    ble: list[dict[str, Any]] = []
    for step in range(300):
        ble.append(
            {
                "t_ms": 20 + step * 200,
                "address": c.ble_address,
                "name": c.ble_name,
                "rssi": -60 - step % 5,
                "service_uuids": [HEART_RATE],
                "manufacturer_data": {str(COMPANY): c.ble_payload},
                "connectable": True,
            }
        )
        ble.append({"t_ms": 30 + step * 200, "address": "02:00:00:00:00:99", "name": c.ble_decoy,
                    "rssi": -50, "service_uuids": [ENVIRONMENT]})  # fmt: skip
    usb = [
        {
            "t_ms": 10 + step * 500,
            "event": "add",
            "device": "/dev/ttyACM7",
            "vid": TEST_VID,
            "pid": TEST_PID,
            "serial_number": c.usb_serial,
            "manufacturer": c.usb_maker,
            "product": c.usb_product,
            "location": "1-4",
        }
        for step in range(120)
    ]
    mdns = [
        {
            "t_ms": 10 + step * 1000,
            "event": "add" if step == 0 else "update",
            "service_type": HTTP,
            "name": f"{c.mdns_instance}.{HTTP}",
            "server": c.mdns_server,
            "addresses": ["192.0.2.77"],
            "port": 8080,
            "txt": {"note": c.mdns_txt, "seq": str(step)},
            "ttl": 120,
        }
        for step in range(60)
    ]
    return {
        "ble": write_fixture(directory / "ble.jsonl", "ble", ble),
        "usb-serial": write_fixture(directory / "usb.jsonl", "usb-serial", usb),
        "mdns": write_fixture(directory / "mdns.jsonl", "mdns", mdns),
    }


# ---- directives --------------------------------------------------------------------------------------------


def ble_scan(window_seconds: int = 2, **filters: Any) -> dict[str, Any]:
    """A heart-rate BLE scan."""
    return scan_directive(window_seconds, filters={"service_uuids": [HEART_RATE], **filters})


# ---- the environment ---------------------------------------------------------------------------------------


@dataclass
class BusEnv:
    """A data dir with a signed test catalog, three principals and canary fixtures."""

    root: Path
    canaries: Canaries
    fixtures: dict[str, Path]
    catalog: Path
    tokens: Tokens

    @property
    def data_dir(self) -> Path:
        """The connector's data dir."""
        return self.root / "data"

    def config(self, nats_url: str | None, **changes: Any) -> ConnectorConfig:
        """A connector configuration over this environment (replay at 1x: windows are wall-clock time)."""
        fields: dict[str, Any] = {
            "data_dir": self.data_dir,
            "catalog": self.catalog,
            "trust_dir": SHIPPED_TRUST,
            "replay": self.fixtures,
            "nats_url": nats_url,
        }
        fields.update(changes)
        return ConnectorConfig(**fields)


def make_env(root: Path) -> BusEnv:
    """Fresh catalog, principals (alice: scan + commands, bob: scan only, ops: operator) and fixtures."""
    canaries = Canaries()
    data_dir = root / "data"
    data_dir.mkdir(parents=True)
    callers = {"alice": (SCAN, REDACT, SLEEP, FAIL, STUBBORN), "bob": (SCAN,)}
    tokens = create_principals(data_dir, callers, ["ops"])
    return BusEnv(
        root, canaries, canary_fixtures(root / "fixtures", canaries), write_catalog(root / "cat"), tokens
    )


class CountingProviders:
    """The configured providers, counting every `start` (a joined retry must not start one)."""

    def __init__(self, config: ConnectorConfig) -> None:
        self._build = provider_factory(config)
        self.starts = 0

    def __call__(self, transport: str, adapter: str | None) -> Provider:
        return _Counted(self._build(transport, adapter), self)


class _Counted:
    def __init__(self, inner: Provider, counter: CountingProviders) -> None:
        self._inner = inner
        self._counter = counter

    @property
    def capabilities(self) -> ProviderCapabilities:
        return self._inner.capabilities

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ProviderSession:
        self._counter.starts += 1
        return await self._inner.start(scope, sink)


@asynccontextmanager
async def running_connector(
    env: BusEnv,
    nats_url: str | None,
    *,
    providers: CountingProviders | None = None,
    wait_bus: bool = True,
    clock: Callable[[], datetime] = wall_clock,
    **changes: Any,
) -> AsyncIterator[Assembled]:
    """The connector in-process (host, poller, Bus), by default once its Bus subscriptions are live."""
    config = env.config(nats_url, **changes)
    async with assemble(config, providers=providers, clock=clock) as assembled:
        if nats_url is not None and wait_bus:
            with anyio.fail_after(10):
                while not assembled.readiness.bus_subscribed:
                    await anyio.sleep(0.01)  # real peer: the Bus subscriptions go live on the nats-server
        yield assembled


def client(url: str, token: str | None, **kw: Any) -> Any:
    """A Bus client (async context manager) with quick reconnects and patient requests.

    15 s per request: a loaded machine (both cores busy, several xdist workers fsyncing) can hold one Bus
    request, a cancel that waits for its subprocess's end, past the library's 5 s default.
    """
    kw.setdefault("reconnect_time_wait", 0.2)
    kw.setdefault("timeout", 15.0)
    return BusClient.connect(url, token=token, **kw)


# ---- the spy -----------------------------------------------------------------------------------------------


@dataclass
class Spy:
    """Everything published on the broker while it listens (`>`), reconnecting across outages."""

    messages: list[Msg] = field(default_factory=list)
    nc: NATS | None = None

    def blobs(self, *, skip_subjects: Sequence[str] = ()) -> dict[str, bytes]:
        """Each message as subject + headers + data bytes, by position."""
        found = {}
        for index, msg in enumerate(self.messages):
            if msg.subject in skip_subjects:
                continue
            headers = json.dumps(msg.headers or {}).encode()
            found[f"{index}:{msg.subject}"] = msg.subject.encode() + headers + msg.data
        return found

    def done(self, op: str) -> list[dict[str, Any]]:
        """The `op.done` announcements for one handle."""
        bodies = [json.loads(m.data) for m in self.messages if m.subject == "sensorium-os.op.done"]
        return [body for body in bodies if body.get("op") == op]

    def replies(self) -> list[dict[str, Any]]:
        """Every reply the service sent (to `_INBOX.` subjects)."""
        return [json.loads(m.data) for m in self.messages if m.subject.startswith("_INBOX.")]


@asynccontextmanager
async def spying(url: str) -> AsyncIterator[Spy]:
    """A `>` subscriber for the duration of the block."""
    spy = Spy()

    async def record(msg: Msg) -> None:
        spy.messages.append(msg)

    # Reconnects faster than the connector (1 s), so it is back before any announcement owed meanwhile.
    nc = await nats.connect(url, reconnect_time_wait=0.05, max_reconnect_attempts=-1)
    spy.nc = nc
    await nc.subscribe(">", cb=record)
    await nc.flush()
    try:
        yield spy
    finally:
        await nc.flush()
        await nc.close()


async def watch_states(bus: BusClient, op: str, *, poll_interval: float | None = 0.5) -> list[str]:
    """Every state `watch` yields, until terminal."""
    return [change["state"] async for change in bus.watch(op, poll_interval=poll_interval)]
