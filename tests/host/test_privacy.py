"""CONTRACT §7 at the host: candidate data reaches its caller, never the registry, its history, views or
metrics.

Canaries are planted in replay fixtures this test writes (BLE names and manufacturer data, USB product and
serial strings, mDNS instance names and TXT records) and in the scope's prefix and identity filters. The
registry's database, WAL and SHM bytes are then searched for each canary, its SHA-256 and SHA-1 hex and its
base64, and for every candidate ref and generation the caller was shown.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from connector.storage.registry import DeferredRegistry
from connector.timer import VirtualTimer
from tests.host.records import record
from tests.host.support import add_principals, check, host_app, poll_until, terminal
from tests.support.directives import HEART_RATE
from tests.support.fixtures import write_fixture
from tests.support.principals import bearer

pytestmark = pytest.mark.asyncio
CANARIES = {
    "ble_name": "CNRYble4e1d9aName",
    "ble_mfr": "CNRYmfr77c2",
    "ble_prefix": "CNRYble4e1d9a",
    "ble_address": "C0:FF:EE:4E:1D:9A",
    "usb_product": "CNRYusb8b03Product",
    "usb_serial": "CNRYserial5f2e",
    "mdns_instance": "CNRYmdns21aa Printer",
    "mdns_txt": "CNRYtxt9d0c",
    "mdns_prefix": "CNRYmdns21aa",
}


def _fixtures(directory: Path) -> dict[str, Path]:
    mfr = {"76": CANARIES["ble_mfr"].encode().hex()}
    ble = [
        {"t_ms": 10 + i, "address": f"C0:FF:EE:00:00:0{i}", "rssi": -50 - i,
         "name": f"{CANARIES['ble_name']}{i}", "service_uuids": [HEART_RATE], "manufacturer_data": mfr}
        for i in range(3)
    ]  # fmt: skip
    usb = [
        {"t_ms": 10, "event": "add", "device": "/dev/ttyUSB9", "vid": 1027, "pid": 24577,
         "serial_number": CANARIES["usb_serial"], "manufacturer": "FTDI", "product": CANARIES["usb_product"]},
    ]  # fmt: skip
    mdns = [
        {"t_ms": 10, "event": "add", "service_type": "_ipp._tcp.local.",
         "name": f"{CANARIES['mdns_instance']}._ipp._tcp.local.", "server": "cnry.local.",
         "addresses": ["192.0.2.77"], "port": 631, "txt": {"note": CANARIES["mdns_txt"]}, "ttl": 120},
    ]  # fmt: skip
    return {
        "ble": write_fixture(directory / "ble.jsonl", "ble", ble),
        "usb-serial": write_fixture(directory / "usb.jsonl", "usb-serial", usb),
        "mdns": write_fixture(directory / "mdns.jsonl", "mdns", mdns),
    }


def _directive(
    transport: str, filters: dict[str, Any], exclusions: dict[str, Any] | None = None
) -> dict[str, Any]:
    scan_input: dict[str, Any] = {"transport": transport, "window_seconds": 1, "filters": filters}
    if exclusions:
        scan_input["exclusions"] = exclusions
    return {
        "schema": "sensorium-directive.v1",
        "action_id": "device.discovery.scan",
        "timing": {"mode": "async", "status_versions": [2]},
        "input": scan_input,
        "causal/context": {"operation/id": f"causal:{transport}"},
    }


SCANS = {
    "ble": _directive(
        "ble",
        {"service_uuids": [HEART_RATE], "name_prefix": CANARIES["ble_prefix"]},
        {"addresses": [CANARIES["ble_address"]]},
    ),
    "usb-serial": _directive(
        "usb-serial", {"vid_pid": [{"vid": 1027, "pid": 24577}], "serial_numbers": [CANARIES["usb_serial"]]}
    ),
    "mdns": _directive(
        "mdns", {"service_types": ["_ipp._tcp.local."], "instance_prefix": CANARIES["mdns_prefix"]}
    ),
}


def _needles(shown: set[str]) -> dict[str, bytes]:
    """Every canary in plain text, base64, SHA-256 and SHA-1 hex; plus refs and generations the caller saw."""
    needles: dict[str, bytes] = {}
    for name, canary in CANARIES.items():
        raw = canary.encode()
        needles[name] = raw
        needles[f"{name}:b64"] = base64.b64encode(raw).rstrip(b"=")
        needles[f"{name}:sha256"] = hashlib.sha256(raw).hexdigest().encode()
        needles[f"{name}:sha1"] = hashlib.sha1(raw).hexdigest().encode()
    for value in shown:
        needles[f"shown:{value}"] = value.encode()
    return needles


def _private_values(polls: list[dict[str, Any]]) -> set[str]:
    """Candidate refs and generations the caller was shown."""
    values: set[str] = set()
    for poll in polls:
        progress = poll.get("progress") or {}
        if progress:
            values.add(progress["generation"])
        candidates = (progress.get("snapshot") or {}).get("candidates", []) + (poll.get("result") or {}).get(
            "candidates", []
        )
        values.update(c["candidate/ref"] for c in candidates)
    return values


def _found_in_files(directory: Path, needles: dict[str, bytes]) -> list[str]:
    found = []
    for path in sorted(directory.iterdir()):
        data = path.read_bytes()
        found += [f"{path.name}:{name}" for name, needle in needles.items() if needle in data]
    return found


async def test_candidate_data_never_reaches_the_registry_views_or_metrics(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    tokens = add_principals(data_dir)
    replays = _fixtures(tmp_path)
    shown: set[str] = set()
    caller_text = ""
    timer = VirtualTimer()
    app = host_app(data_dir, replay=replays, mdns_interfaces=["127.0.0.1"], timer=timer)
    async with app as (assembled, client):
        for transport, directive in SCANS.items():
            accepted = await client.post("/v1/host/directives", json=directive, headers=bearer(tokens.alice))
            assert accepted.status_code == 202, accepted.text
            href = accepted.json()["status_href"]
            polls = await poll_until(client, href, tokens.alice, terminal, timer=timer)
            check("deferred-operation-status.v2", polls)
            assert polls[-1]["status"] == "completed" and polls[-1]["result"]["candidates"], transport
            shown |= _private_values(polls)
            caller_text += json.dumps(polls)
        # The authorised caller does get the device data ...
        for name in ("ble_name", "usb_product", "mdns_instance"):
            assert CANARIES[name] in caller_text, name
        # ... while everything durable or operator-facing stays clean.
        listing = await client.get("/v1/admin/deferred-operations", headers=bearer(tokens.operator))
        details = [
            (await client.get(f"/v1/admin/deferred-operations/{op}", headers=bearer(tokens.operator))).text
            for op in (v["operation/id"] for v in listing.json()["operations"])
        ]
        metrics = (await client.get("/metrics")).text
        needles = _needles(shown)
        for text in (listing.text, *details, metrics):
            assert [n for n, needle in needles.items() if needle.decode() in text] == []
        registry_dir = assembled.registry.path.parent
        assert (registry_dir / "deferred-operations.sqlite-wal").exists()
        assert _found_in_files(registry_dir, needles) == []  # WAL and SHM while the host runs
        history = [
            e
            for v in listing.json()["operations"]
            for e in await assembled.registry.history(v["operation/id"])
        ]
        assert history and all(e.digest.encode() not in b"".join(needles.values()) for e in history)
    assert _found_in_files(registry_dir, needles) == []  # the database after the final checkpoint


async def test_the_search_would_find_a_leak_in_the_registry_files(tmp_path: Path) -> None:
    """Control: a digest of a canary written into a registry is found by the same search."""
    needles = _needles(set())
    leaked = record(metadata={"status": "pending", "oops": needles["ble_name:sha256"].decode()})
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(leaked)
        assert "deferred-operations.sqlite-wal:ble_name:sha256" in _found_in_files(
            registry.path.parent, needles
        )
