"""CONTRACT §7 end to end: candidate data reaches the authorised caller and nothing else, across a kill -9.

One real `serve` process plays replay fixtures written here, with unique canary strings in BLE advert names
and manufacturer data, mDNS instance names and TXT records, and USB product and serial strings (plus the
scope's prefix filter values and an out-of-scope decoy). Full scans of every transport run through the host
route; the caller must see the canaries a candidate may carry (CONTRACT §6.5: BLE local name, mDNS instance,
USB product). Then scans are killed mid-window with SIGKILL, every SQLite file must pass `PRAGMA
integrity_check`, a restart must report them `failed` / `interrupted-by-restart`, and no canary - nor its
SHA-256 or SHA-1 hex, nor its base64 - may appear in any file under the data dir (the files right after the
kill and after the final stop), in the server logs, or in the operator's console pages.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.serve_process import (
    add_test_principals,
    host_status,
    replay_serving,
    start_host_scan,
    start_replay_serve,
    wait_host_status,
)
from tests.support.directives import HEART_RATE, scan_directive
from tests.support.fixtures import write_fixture
from tests.support.principals import Tokens
from tests.support.serving import ServeProcess

ENVIRONMENT = "0000181a-0000-1000-8000-00805f9b34fb"
TEST_VID, TEST_PID = 0x1209, 0x0001  # pid.codes test id
HTTP = "_http._tcp.local."
COMPANY = 0xFFFF  # the Bluetooth SIG's "no company" id, reserved for tests


def _canary(label: str) -> str:
    return f"CANARY{label}{secrets.token_hex(8)}"


@dataclass(frozen=True, slots=True)
class Canaries:
    """Unique strings planted in the fixtures; the `*_prefix` ones are also scope filter values."""

    ble_name_prefix: str
    ble_name: str
    ble_payload: bytes
    ble_address: str
    ble_decoy_name: str
    mdns_instance_prefix: str
    mdns_instance: str
    mdns_txt: str
    mdns_server: str
    usb_product: str
    usb_serial: str
    usb_manufacturer: str

    @classmethod
    def fresh(cls) -> Canaries:
        ble_prefix, mdns_prefix = _canary("blepfx"), _canary("mdnspfx")
        mac = ":".join(f"{b:02X}" for b in secrets.token_bytes(6))
        return cls(
            ble_name_prefix=ble_prefix,
            ble_name=ble_prefix + secrets.token_hex(6),
            ble_payload=secrets.token_bytes(14),
            ble_address=mac,
            ble_decoy_name=_canary("decoy"),
            mdns_instance_prefix=mdns_prefix,
            mdns_instance=mdns_prefix + secrets.token_hex(6),
            mdns_txt=_canary("txt"),
            mdns_server=_canary("srv").lower() + ".local.",
            usb_product=_canary("product"),
            usb_serial=_canary("serial"),
            usb_manufacturer=_canary("maker"),
        )

    def strings(self) -> dict[str, str]:
        """Every planted string by name (the payload as the hex text the fixture holds)."""
        values = {name: getattr(self, name) for name in self.__slots__ if name != "ble_payload"}
        values["ble_payload"] = self.ble_payload.hex()
        return values


def needles(canaries: Canaries) -> dict[str, bytes]:
    """Every byte pattern that must not be found, named for the failure message."""
    found: dict[str, bytes] = {}
    for name, text in canaries.strings().items():
        raw = text.encode("utf-8")
        for variant, value in ((name, raw), (f"{name}/upper", text.upper().encode())):
            found[variant] = value
        found[f"{name}/sha256"] = hashlib.sha256(raw).hexdigest().encode()
        found[f"{name}/sha256-upper"] = hashlib.sha256(raw).hexdigest().upper().encode()
        found[f"{name}/sha256-raw"] = hashlib.sha256(raw).digest()
        found[f"{name}/sha1"] = hashlib.sha1(raw).hexdigest().encode()
        found[f"{name}/sha1-upper"] = hashlib.sha1(raw).hexdigest().upper().encode()
        found[f"{name}/base64"] = base64.b64encode(raw).rstrip(b"=")
        found[f"{name}/base64url"] = base64.urlsafe_b64encode(raw).rstrip(b"=")
    payload = canaries.ble_payload
    found["ble_payload/raw"] = payload
    found["ble_payload/raw-sha256"] = hashlib.sha256(payload).hexdigest().encode()
    found["ble_payload/raw-sha1"] = hashlib.sha1(payload).hexdigest().encode()
    found["ble_payload/raw-base64"] = base64.b64encode(payload).rstrip(b"=")
    found["ble_mac/compact"] = canaries.ble_address.replace(":", "").lower().encode()
    return found


def hits(blob: bytes, patterns: Mapping[str, bytes]) -> list[str]:
    """Names of the patterns present in `blob`."""
    return [name for name, pattern in patterns.items() if pattern in blob]


# ---- fixtures ----------------------------------------------------------------------------------------------


def ble_lines(c: Canaries) -> list[dict[str, Any]]:
    """The canary strap every 200 ms for 30 s, and an out-of-scope decoy."""
    lines: list[dict[str, Any]] = []
    for step in range(150):
        lines.append(
            {
                "t_ms": 20 + step * 200,
                "address": c.ble_address,
                "name": c.ble_name,
                "rssi": -60 - step % 5,
                "service_uuids": [HEART_RATE],
                "manufacturer_data": {str(COMPANY): c.ble_payload.hex()},
                "connectable": True,
            }
        )
        lines.append(
            {
                "t_ms": 30 + step * 200,
                "address": "02:00:00:00:00:99",
                "name": c.ble_decoy_name,
                "rssi": -50,
                "service_uuids": [ENVIRONMENT],
                "connectable": False,
            }
        )
    return lines


def usb_lines(c: Canaries) -> list[dict[str, Any]]:
    """An enumeration pass every 500 ms for 30 s with the canary board attached."""
    return [
        {
            "t_ms": 10 + step * 500,
            "event": "add",
            "device": "/dev/ttyACM7",
            "vid": TEST_VID,
            "pid": TEST_PID,
            "serial_number": c.usb_serial,
            "manufacturer": c.usb_manufacturer,
            "product": c.usb_product,
            "location": "1-4",
            "interface": c.usb_product,
        }
        for step in range(60)
    ]


def mdns_lines(c: Canaries) -> list[dict[str, Any]]:
    """The canary service announced at once, then its TXT updated every second."""
    lines: list[dict[str, Any]] = []
    for step in range(30):
        lines.append(
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
        )
    return lines


def directives(c: Canaries, window_seconds: int) -> dict[str, dict[str, Any]]:
    """One scan per transport whose scope admits exactly the canary device."""
    return {
        "ble": scan_directive(
            window_seconds, filters={"service_uuids": [HEART_RATE], "name_prefix": c.ble_name_prefix}
        ),
        "usb-serial": scan_directive(
            window_seconds, transport="usb-serial", filters={"vid_pid": [{"vid": TEST_VID, "pid": TEST_PID}]}
        ),
        "mdns": scan_directive(
            window_seconds,
            transport="mdns",
            filters={"service_types": [HTTP], "instance_prefix": c.mdns_instance_prefix},
        ),
    }


# ---- checks ------------------------------------------------------------------------------------------------


def candidates_of(status: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The candidates a caller sees: the result's when completed, else the progress snapshot's."""
    if "result" in status:
        return list(status["result"]["candidates"])
    return list(status.get("progress", {}).get("snapshot", {}).get("candidates", []))


def expected_label(transport: str, c: Canaries) -> str:
    """CONTRACT §6.5: the label a candidate of the canary device carries."""
    return {"ble": c.ble_name, "usb-serial": c.usb_product, "mdns": c.mdns_instance}[transport]


def assert_caller_sees_canary(transport: str, status: Mapping[str, Any], c: Canaries) -> None:
    """The canary device reaches its caller; the decoy and identities do not."""
    found = candidates_of(status)
    assert [candidate["label"] for candidate in found] == [expected_label(transport, c)], transport
    text = repr(status)
    for secret in (c.ble_decoy_name, c.ble_address, c.usb_serial, c.mdns_server, c.ble_payload.hex()):
        assert secret not in text, transport


def sqlite_files(root: Path) -> list[Path]:
    """Every SQLite database under `root`, by its header."""
    return [p for p in root.rglob("*") if p.is_file() and p.read_bytes()[:16] == b"SQLite format 3\x00"]


def assert_integrity(root: Path) -> None:
    """`PRAGMA integrity_check` is `ok` on every database file."""
    databases = sqlite_files(root)
    assert any(p.name == "deferred-operations.sqlite" for p in databases), "no registry database"
    for database in databases:
        connection = sqlite3.connect(database)
        try:
            assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)], database.name
        finally:
            connection.close()


def snapshot(root: Path) -> dict[str, bytes]:
    """The bytes of every file under `root` (SQLite files with their WAL and SHM included)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def assert_nothing_found(blobs: Mapping[str, bytes], patterns: Mapping[str, bytes]) -> None:
    """No pattern in any blob; the failure names files and patterns, never the values."""
    leaks = {name: found for name, blob in blobs.items() if (found := hits(blob, patterns))}
    assert not leaks, f"candidate data found: {leaks}"


def wait_all_delivered(client: httpx.Client, ops: Mapping[str, str], c: Canaries) -> None:
    """Each running scan has shown its canary candidate to the caller."""
    for transport, op_id in ops.items():
        for _ in range(100):
            status = host_status(client, op_id)
            assert status["status"] in ("pending", "running"), transport
            if candidates_of(status):
                assert_caller_sees_canary(transport, status, c)
                break
            time.sleep(0.1)  # real peer: the serve process
        else:
            raise AssertionError(f"{transport}: no candidate delivered while running")


def console_pages(server: ServeProcess, token: str, op_ids: Iterable[str]) -> dict[str, bytes]:
    """The operator's JSON admin views and console pages for these operations."""
    pages: dict[str, bytes] = {}
    with server.client(token) as admin:
        pages["admin-list"] = admin.get("/v1/admin/deferred-operations").content
        for op_id in op_ids:
            pages[f"admin-detail {op_id}"] = admin.get(f"/v1/admin/deferred-operations/{op_id}").content
    with httpx.Client(base_url=server.base_url, timeout=10.0, follow_redirects=False) as browser:
        form = browser.get("/admin/sign-in")
        nonce = form.text.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]
        signed_in = browser.post("/admin/sign-in", data={"csrf_token": nonce, "token": token})
        assert signed_in.status_code == 303
        pages["console-list"] = browser.get("/admin/deferred-operations").content
        for op_id in op_ids:
            page = browser.get(f"/admin/deferred-operations/{op_id}")
            assert page.status_code == 200
            pages[f"console-detail {op_id}"] = page.content
    return pages


# ---- the test ----------------------------------------------------------------------------------------------


@pytest.mark.serve
@pytest.mark.timeout(180)
def test_canaries_reach_only_the_caller_across_a_kill_9(tmp_path: Path) -> None:
    c = Canaries.fresh()
    patterns = needles(c)
    data_dir, logs, fixtures = tmp_path / "data", tmp_path / "logs", tmp_path / "fixtures"
    fixtures.mkdir()
    tokens: Tokens = add_test_principals(data_dir)
    replays = {
        "ble": write_fixture(fixtures / "ble.jsonl", "ble", ble_lines(c)),
        "usb-serial": write_fixture(fixtures / "usb.jsonl", "usb-serial", usb_lines(c)),
        "mdns": write_fixture(fixtures / "mdns.jsonl", "mdns", mdns_lines(c)),
    }
    # The search works: every planted string is found in the fixtures it was planted in.
    planted = b"".join(path.read_bytes() for path in replays.values())
    assert set(hits(planted, {k: v for k, v in patterns.items() if "/" not in k})) == set(c.strings())

    first = start_replay_serve(data_dir, logs, name="first", replays=replays)
    try:
        with first.client(tokens.caller) as caller:
            full = {t: start_host_scan(caller, d) for t, d in directives(c, 2).items()}
            for transport, op_id in full.items():
                done = wait_host_status(caller, op_id, ("completed", "failed", "timed-out", "expired"))
                assert done["status"] == "completed", (transport, done.get("error"))
                assert_caller_sees_canary(transport, done, c)
            killed = {t: start_host_scan(caller, d) for t, d in directives(c, 60).items()}
            wait_all_delivered(caller, killed, c)
    finally:
        first.kill9()
    after_kill = snapshot(data_dir)
    # The searched bytes do hold the durable rows: every operation id is in the files left by the kill.
    for op_id in (*full.values(), *killed.values()):
        assert any(op_id.encode() in blob for blob in after_kill.values()), op_id
    assert_integrity(data_dir)

    with replay_serving(data_dir, logs, name="second", replays=replays) as second:
        with second.client(tokens.caller) as caller:
            for transport, op_id in killed.items():
                status = host_status(caller, op_id)
                assert status["status"] == "failed", transport
                assert status["error"]["code"] == "interrupted-by-restart", transport
                assert "progress" not in status and "result" not in status, transport
        pages = console_pages(second, tokens.operator, [*full.values(), *killed.values()])
    # The exit code after SIGTERM is tests/e2e/test_serve_process.py's concern; the files are searched.
    final = snapshot(data_dir)  # before the integrity check: closing SQLite's last connection folds the WAL
    assert_integrity(data_dir)

    blobs = {f"after-kill {name}": blob for name, blob in after_kill.items()}
    blobs |= {f"final {name}": blob for name, blob in final.items()}
    blobs |= {f"log {p.name}": p.read_bytes() for p in logs.iterdir()}
    blobs |= pages
    assert "storage/deferred-operations.sqlite-wal" in after_kill  # the kill left the WAL: it was searched
    assert_nothing_found(blobs, patterns)
