"""Issue 13: 20 kill -9 cycles of one real `serve` (with a real nats-server) across the connector, host and
Bus routes, keyed and unkeyed.

Every cycle starts `serve` over the same data dir, checks everything admitted in earlier cycles, retries
the keyed admissions, admits one scan on each route (keyed on even cycles), waits until candidates carrying
canaries reach the caller, and kills the process with SIGKILL mid-window. Asserted over all cycles: no
accepted operation lost or answered 404 (or Bus `unknown`), no second session (a keyed retry answers the
first answer and the active-session gauge stays 0), every SQLite file passes `integrity_check` after every
kill, and no canary - raw, upper case, hex, base64, or its SHA-256, SHA-1 or MD5 hex digest - appears in
any file under the data dir (the -wal and -shm files included), in the server logs or in the broker's log.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import signal
import sqlite3
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from connector.bus.client import BusClient
from connector.core.authority import make_grant
from connector.storage.principals import add_principal
from tests.bus.broker import NatsServer
from tests.support.directives import HEART_RATE, scan_directive
from tests.support.fixtures import write_fixture
from tests.support.paths import SHIPPED_CATALOG, SHIPPED_TRUST
from tests.support.serving import start_serve

pytestmark = [pytest.mark.asyncio, pytest.mark.serve, pytest.mark.timeout(240)]

CYCLES = int(os.environ.get("SENSORIUM_KILL9_CYCLES", "20"))
SCAN = "device.discovery.scan"
_GAUGE = re.compile(r"^sensorium_discovery_sessions_active (\S+)$", re.M)


@dataclass(frozen=True, slots=True)
class Canaries:
    """Unique device data planted in the fixture (names, payloads, addresses)."""

    names: tuple[str, ...]
    payloads: tuple[str, ...]
    addresses: tuple[str, ...]

    @classmethod
    def fresh(cls) -> Canaries:
        return cls(
            names=tuple(f"CANARY13n{secrets.token_hex(6)}" for _ in range(3)),
            payloads=tuple(secrets.token_hex(10) for _ in range(3)),
            addresses=tuple(":".join(f"{b:02X}" for b in secrets.token_bytes(6)) for _ in range(3)),
        )

    def needles(self) -> dict[str, bytes]:
        """Every byte pattern that must not be found, named for the failure message."""
        found: dict[str, bytes] = {}
        texts = {f"name{i}": n for i, n in enumerate(self.names)}
        texts |= {f"payload{i}": p for i, p in enumerate(self.payloads)}
        texts |= {f"address{i}": a for i, a in enumerate(self.addresses)}
        texts |= {f"address{i}/compact": a.replace(":", "").lower() for i, a in enumerate(self.addresses)}
        for name, text in texts.items():
            raw = text.encode()
            found[name] = raw
            found[f"{name}/upper"] = text.upper().encode()
            found[f"{name}/hex"] = raw.hex().encode()
            found[f"{name}/base64"] = base64.b64encode(raw).rstrip(b"=")
            for algorithm in ("sha256", "sha1", "md5"):
                digest = hashlib.new(algorithm, raw)
                found[f"{name}/{algorithm}"] = digest.hexdigest().encode()
                found[f"{name}/{algorithm}-raw"] = digest.digest()
        for i, payload in enumerate(self.payloads):
            found[f"payload{i}/bytes"] = bytes.fromhex(payload)
            found[f"payload{i}/bytes-b64"] = base64.b64encode(bytes.fromhex(payload)).rstrip(b"=")
        return found


@dataclass(slots=True)
class Admitted:
    """One accepted operation and how to ask about it again."""

    route: str  # "connector" | "host" | "bus"
    op_id: str
    directive: dict[str, Any]
    keyed: bool
    first_status: int = 202
    first_body: bytes = b""
    bus_op: str | None = None


@dataclass(slots=True)
class Tally:
    lost: list[str] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)
    second_sessions: list[str] = field(default_factory=list)
    integrity: list[str] = field(default_factory=list)
    canaries: list[str] = field(default_factory=list)


def ble_fixture(path: Path, canaries: Canaries) -> Path:
    """Three heart-rate devices with canary names, payloads and addresses, advertising for 60 s."""
    lines = []
    for t_ms in range(0, 60_000, 500):
        for index in range(3):
            lines.append(
                {
                    "t_ms": t_ms + index,
                    "address": canaries.addresses[index],
                    "name": canaries.names[index],
                    "rssi": -60 - index,
                    "service_uuids": [HEART_RATE],
                    "manufacturer_data": {"65535": canaries.payloads[index]},
                }
            )
    return write_fixture(path, "ble", lines)


def start_bus_serve(
    data_dir: Path, fixture: Path, nats_url: str, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """`serve --port 0` with the replay fixture and the Bus; returns once `/healthz` answers 200."""
    args: list[str | Path] = ["--data-dir", data_dir, "--catalog", SHIPPED_CATALOG, "--trust", SHIPPED_TRUST]
    server = start_serve(*args, "--replay", f"ble={fixture}", "--nats", nats_url, log=log, stdout=log)
    return server.process, server.base_url


def integrity_errors(data_dir: Path) -> list[str]:
    """SQLite files whose `integrity_check` is not `ok`."""
    bad = []
    for path in sorted(data_dir.rglob("*.sqlite")):
        connection = sqlite3.connect(path)
        try:
            result = connection.execute("PRAGMA integrity_check").fetchall()
        finally:
            connection.close()
        if result != [("ok",)]:
            bad.append(str(path.relative_to(data_dir)))
    return bad


def canary_hits(roots: list[Path], needles: Mapping[str, bytes]) -> list[str]:
    """`file: needle` for every needle found in any file under `roots` (-wal and -shm included)."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.is_file():
                blob = path.read_bytes()
                found += [f"{path.name}: {name}" for name, needle in needles.items() if needle in blob]
    return found


async def admit(route: str, keyed: bool, cycle: int, http: httpx.AsyncClient, bus: BusClient) -> Admitted:
    """One 30 s scan through `route`; keyed with a per-cycle key."""
    key = f"k13-{route}-{cycle}" if keyed else None
    directive = scan_directive(30)
    if key is not None and route != "bus":
        directive["idempotency_key"] = key
    if route == "bus":
        reply = await bus.start(directive, op=key)
        assert reply["state"] in ("queued", "running"), reply
        record = Admitted(route, reply["op"], directive, keyed, bus_op=key)
        record.first_body = json.dumps(reply, sort_keys=True).encode()
        return record
    path = "/v1/directives" if route == "connector" else "/v1/host/directives"
    response = await http.post(path, json=directive)
    assert response.status_code == 202, response.text
    body = response.json()
    op_id = body["connector_operation/id"] if route == "connector" else body["operation/id"]
    return Admitted(route, op_id, directive, keyed, response.status_code, response.content)


async def check_earlier(record: Admitted, http: httpx.AsyncClient, bus: BusClient, tally: Tally) -> None:
    """After a restart: the operation is still known, ended, and a keyed retry answers the first answer."""
    if record.route == "bus":
        state = await bus.get(record.bus_op or record.op_id)
        if state["state"] == "unknown":
            tally.not_found.append(record.op_id)
        elif state["state"] not in ("lost", "failed", "done", "cancelled"):
            tally.lost.append(f"{record.op_id}: {state['state']}")
        if record.keyed:
            restarted = await bus.start(record.directive, op=record.bus_op)
            if restarted["state"] in ("queued", "running"):
                tally.second_sessions.append(record.op_id)
        return
    prefix = "/v1/operations/" if record.route == "connector" else "/v1/host/operations/"
    response = await http.get(prefix + record.op_id)
    if response.status_code == 404:
        tally.not_found.append(record.op_id)
        return
    status = response.json()
    if status["status"] != "failed" or status.get("error", {}).get("code") != "interrupted-by-restart":
        tally.lost.append(f"{record.op_id}: {status['status']}")
    if status.get("cleanup") != {"state": "confirmed", "claim": "released"}:
        tally.lost.append(f"{record.op_id}: cleanup {status.get('cleanup')}")
    if record.keyed:
        path = "/v1/directives" if record.route == "connector" else "/v1/host/directives"
        again = await http.post(path, json=record.directive)
        if (again.status_code, again.content) != (record.first_status, record.first_body):
            tally.second_sessions.append(record.op_id)


async def active_sessions(http: httpx.AsyncClient) -> float:
    found = _GAUGE.search((await http.get("/metrics")).text)
    assert found is not None
    return float(found.group(1))


async def test_twenty_kill9_cycles_lose_nothing_and_leak_nothing(tmp_path: Path) -> None:
    canaries = Canaries.fresh()
    needles = canaries.needles()
    data_dir, logs = tmp_path / "data", tmp_path / "logs"
    logs.mkdir()
    (tmp_path / "fixtures").mkdir()
    fixture = ble_fixture(tmp_path / "fixtures" / "ble.jsonl", canaries)
    token = add_principal(data_dir, "caller-13", "caller", [make_grant(SCAN)])
    broker = NatsServer(logs / "nats")
    broker.start()
    tally = Tally()
    admitted: list[Admitted] = []
    process: subprocess.Popen[bytes] | None = None
    try:
        for cycle in range(CYCLES + 1):
            process, url = start_bus_serve(data_dir, fixture, broker.url, logs / f"serve-{cycle}.log")
            headers = {"Authorization": f"Bearer {token}"}
            try:
                async with (
                    httpx.AsyncClient(base_url=url, headers=headers, timeout=10) as http,
                    BusClient.connect(broker.url, token=token, reconnect_time_wait=0.2) as bus,
                ):
                    for record in admitted:
                        await check_earlier(record, http, bus, tally)
                    if await active_sessions(http) != 0:
                        tally.second_sessions.append(f"cycle {cycle}: a session runs after the retries")
                    if cycle == CYCLES:
                        break
                    keyed = cycle % 2 == 0
                    fresh = [
                        await admit(route, keyed, cycle, http, bus) for route in ("connector", "host", "bus")
                    ]
                    admitted += fresh
                    await _until_candidates_reach_the_caller(http, fresh[0].op_id, canaries)
            finally:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=10)
            tally.integrity += [f"cycle {cycle}: {name}" for name in integrity_errors(data_dir)]
            tally.canaries += [f"cycle {cycle}: {hit}" for hit in canary_hits([data_dir, logs], needles)]
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        broker.stop()
    tally.canaries += canary_hits([data_dir, logs], needles)
    assert len(admitted) == 3 * CYCLES
    assert tally.lost == [] and tally.not_found == [] and tally.second_sessions == []
    assert tally.integrity == [] and tally.canaries == []


async def _until_candidates_reach_the_caller(http: httpx.AsyncClient, op_id: str, canaries: Canaries) -> None:
    """The scan is running with the canary devices in its snapshot (so they are in the server's memory)."""
    with anyio.fail_after(15):
        while True:
            status = (await http.get(f"/v1/operations/{op_id}")).json()
            snapshot = (status.get("progress") or {}).get("snapshot") or {}
            labels = {candidate.get("label") for candidate in snapshot.get("candidates", ())}
            if set(canaries.names) <= labels:
                return
            await anyio.sleep(0.05)  # real peer: the serve process
