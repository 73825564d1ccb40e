"""Runs mDNS scans inside a lab namespace (`ip netns exec NS python mdns_ns_driver.py`), driven over stdio.

One `MdnsProvider` for the process's lifetime, so that consecutive sessions would share anything a
provider kept between them. Commands arrive as JSON lines on stdin; every status change of a scan, and
every answer, leaves as a JSON line on stdout:

- `{"cmd": "scan", "id", "types", "window_s", "ttl_s", "instance_prefix"?, "exclude_prefix"?}` ->
  `{"id", "t", "status"}` lines (the v2 status at each change) until the terminal one;
- `{"cmd": "sniff", "ifname"}` starts counting outgoing mDNS questions on `ifname` (AF_PACKET);
  `{"cmd": "questions"}` -> `{"questions": [[qtype, qname], ...], "query_packets": n}`;
- `{"cmd": "bare_browse", "types", "seconds"}`: a plain python-zeroconf `AsyncServiceBrowser` on the same
  interfaces for `seconds` (the benchmark's reference) -> `{"bare_done": true}`;
- `{"cmd": "quit"}`.
"""

from __future__ import annotations

import json
import secrets
import socket
import sys
import threading
import time
from typing import Any

import anyio
import anyio.to_thread

from connector.core.admission import SessionSpec
from connector.core.clock import wall_clock_ms
from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.core.scope import DiscoveryProfile, DiscoveryScope, ScopeFilter
from connector.runtime.manager import DiscoveryManager, ScanAdmission
from providers.mdns import MdnsProvider

_ETH_P_ALL = 0x0003
_PACKET_OUTGOING = 4


def emit(document: dict[str, Any]) -> None:
    """One JSON line on stdout."""
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()


class Sniffer:
    """Outgoing mDNS questions on one interface, parsed with python-zeroconf's own `DNSIncoming`."""

    def __init__(self, ifname: str) -> None:
        self._sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(_ETH_P_ALL))
        self._sock.bind((ifname, 0))
        self._sock.settimeout(0.2)
        self.questions: list[tuple[int, str]] = []
        self.query_packets = 0
        self._running = True
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from zeroconf._protocol.incoming import DNSIncoming

        while self._running:
            try:
                frame, meta = self._sock.recvfrom(65535)
            except TimeoutError:
                continue
            if meta[2] != _PACKET_OUTGOING:
                continue
            payload = _mdns_payload(frame)
            if payload is None:
                continue
            message = DNSIncoming(payload)
            if message.is_query():
                self.query_packets += 1
                self.questions.extend((q.type, q.name.lower()) for q in message.questions)

    def close(self) -> None:
        self._running = False
        self._thread.join()
        self._sock.close()


def _mdns_payload(frame: bytes) -> bytes | None:
    """The UDP payload of an Ethernet frame to or from port 5353, else None."""
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype == 0x0800:
        header = (frame[14] & 0x0F) * 4
        if frame[23] != 17:
            return None
        udp = 14 + header
    elif ethertype == 0x86DD:
        if frame[20] != 17:
            return None
        udp = 14 + 40
    else:
        return None
    if int.from_bytes(frame[udp + 2 : udp + 4], "big") != 5353:
        return None
    return frame[udp + 8 :]


def profile(ttl_s: int) -> DiscoveryProfile:
    """The example catalog's profile with a shortened candidate TTL."""
    return DiscoveryProfile(
        transports=("mdns",),
        max_window_seconds=60,
        max_candidates=64,
        max_snapshot_bytes=65536,
        min_revision_interval_ms=250,
        max_revisions=1000,
        candidate_ttl_seconds=ttl_s,
        cleanup_timeout_ms=4000,
    )


async def scan(manager: DiscoveryManager, provider: MdnsProvider, command: dict[str, Any]) -> None:
    """One scan, every status change emitted."""
    prefix, exclude = command.get("instance_prefix"), command.get("exclude_prefix")
    scope = DiscoveryScope(
        transport="mdns",
        window_seconds=command["window_s"],
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(service_types=tuple(command["types"]), instance_prefix=prefix),
        exclusions=None if exclude is None else ScopeFilter(instance_prefix=exclude),
        cleanup_timeout_ms=4000,
    )
    now = wall_clock_ms()
    started = time.monotonic()
    spec = SessionSpec(
        operation_id=random_operation_id(OPERATION_KIND, secrets.token_bytes(16)),
        owner="lab",
        action_id="device.discovery.scan",
        scope=scope,
        profile=profile(command["ttl_s"]),
        created_at_ms=now,
        window_end_ms=now + command["window_s"] * 1000,
        cut_by_deadline=False,
        timeout_at_ms=None,
        expires_at_ms=now + 120_000,
        causal_context=None,
        retry_after_seconds=1,
    )
    await manager.admit(ScanAdmission(spec, provider))
    revision = 0
    while True:
        status = await manager.status(spec.operation_id, after=revision, wait_s=1.0)
        assert status is not None  # the manager holds its sessions until it is left
        progress = status.get("progress")
        revision = max(revision, progress["revision"] if progress else 0)
        emit({"id": command["id"], "t": round(time.monotonic() - started, 3), "status": status})
        if status["status"] not in ("pending", "running"):
            return


async def bare_browse(setting: str | None, command: dict[str, Any]) -> None:
    """python-zeroconf's own ServiceBrowser schedule, nothing else, on the interfaces a session would use."""
    from zeroconf import DNSQuestionType
    from zeroconf.asyncio import AsyncServiceBrowser

    from providers.mdns import open_engine
    from providers.mdns_interfaces import check_setting, select_interfaces

    azc = await open_engine(select_interfaces(check_setting(setting)))
    browser = AsyncServiceBrowser(
        azc.zeroconf, list(command["types"]), handlers=[lambda **_: None], question_type=DNSQuestionType.QM
    )
    await anyio.sleep(command["seconds"])  # real peer: the scripted browse's own run time
    await browser.async_cancel()
    await azc.async_close()
    emit({"bare_done": True})


async def main() -> None:
    setting = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1] != "default" else None
    provider = MdnsProvider(interfaces=setting)
    sniffer: Sniffer | None = None
    async with DiscoveryManager() as manager, anyio.create_task_group() as scans:
        emit({"ready": True})
        while line := await anyio.to_thread.run_sync(sys.stdin.readline):
            command = json.loads(line)
            if command["cmd"] == "scan":
                scans.start_soon(scan, manager, provider, command)
            elif command["cmd"] == "sniff":
                sniffer = Sniffer(command["ifname"])
                emit({"sniffing": True})
            elif command["cmd"] == "questions":
                emit(
                    {
                        "questions": [] if sniffer is None else sniffer.questions,
                        "query_packets": 0 if sniffer is None else sniffer.query_packets,
                    }
                )
            elif command["cmd"] == "bare_browse":
                scans.start_soon(bare_browse, setting, command)
            elif command["cmd"] == "quit":
                break
        scans.cancel_scope.cancel()
    if sniffer is not None:
        sniffer.close()
    await provider.aclose()


if __name__ == "__main__":
    anyio.run(main)
