"""Whole discovery sessions on the real BLE provider (bleak, unpatched) against emulated BlueZ.

The runtime turns the stop into the terminal status: acknowledged, or proven by disconnecting the worker,
-> `cancelled` (the proof adds `stop-by-disconnect`); a wedged bluetoothd -> `failed`
`cancellation-unconfirmed` with the claim held until a later round trip answers.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.contract.validate import validate
from connector.core.admission import SessionSpec
from connector.core.clock import wall_clock_ms
from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.core.scope import DiscoveryProfile, DiscoveryScope, ScopeFilter
from connector.errors import AdmissionError
from connector.runtime.claims import claim_key
from connector.runtime.manager import DiscoveryManager, ScanAdmission
from providers.base import ObservationSink, ProviderSession, finish_cleanup
from providers.ble import BleProvider, BleSession
from tests.providers.bluez_mock import BluezController, RecordingSink, bluez, every_advert
from tests.runtime.sessions import cancelled, status_of
from tests.support.waiting import poll

__all__ = ["bluez", "every_advert"]  # the fixtures, imported above

HEART = "0000180d-0000-1000-8000-00805f9b34fb"
STRAP = "AA:BB:CC:00:00:01"
STRANGER = "AA:BB:CC:00:00:99"
PROFILE = DiscoveryProfile(
    transports=("ble",),
    max_window_seconds=60,
    max_candidates=64,
    max_snapshot_bytes=65536,
    min_revision_interval_ms=50,
    max_revisions=1000,
    candidate_ttl_seconds=30,
    cleanup_timeout_ms=300,
)
SCOPE = DiscoveryScope(
    transport="ble",
    window_seconds=10,
    max_candidates=64,
    max_snapshot_bytes=65536,
    filters=ScopeFilter(service_uuids=(HEART,)),
    cleanup_timeout_ms=PROFILE.cleanup_timeout_ms,
)


def new_manager() -> DiscoveryManager:
    """A manager with quick background cleanup retries (entered inside each test: one task owns it)."""
    return DiscoveryManager(cleanup_retry_initial_s=0.05, cleanup_retry_max_s=0.2)


async def start_scan(
    manager: DiscoveryManager,
    window_ms: int = 10_000,
    *,
    adapter: str | None = None,
    profile: DiscoveryProfile = PROFILE,
    timeout_ms: int | None = None,
    provider: BleProvider | None = None,
) -> str:
    operation_id = random_operation_id(OPERATION_KIND, secrets.token_bytes(16))
    now = wall_clock_ms()
    spec = SessionSpec(
        operation_id=operation_id,
        owner="alice",
        action_id="device.discovery.scan",
        scope=replace(SCOPE, adapter=adapter),
        profile=profile,
        created_at_ms=now,
        window_end_ms=now + window_ms,
        cut_by_deadline=False,
        timeout_at_ms=None if timeout_ms is None else now + timeout_ms,
        expires_at_ms=now + 60_000,
        causal_context=None,
        retry_after_seconds=1,
    )
    await manager.admit(ScanAdmission(spec, provider or BleProvider()))
    return operation_id


class _BegunEarly(BleProvider):
    """The BLE provider, but its start already reached StartDiscovery: the session's timeout cuts it there."""

    def __init__(self, begun: asyncio.Future[ProviderSession]) -> None:
        super().__init__()
        self._begun = begun

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ProviderSession:
        """The begun start; a cut reaches it like it reaches a start the session began itself."""
        try:
            return await asyncio.shield(self._begun)
        except asyncio.CancelledError:
            self._begun.cancel()
            await finish_cleanup(asyncio.wait({self._begun}))
            return self._begun.result()  # StartUnconfirmed: the discovery session may still run


async def poll_until(
    manager: DiscoveryManager, operation_id: str, predicate: Any, limit_s: float = 30.0
) -> list[dict[str, Any]]:
    """Poll every 20 ms until `predicate(status)`; returns every status seen."""

    async def status() -> dict[str, Any]:
        return await status_of(manager, operation_id)

    return await poll(status, predicate, timeout=limit_s, interval=0.02)


def snapshot_labels(status: dict[str, Any]) -> list[str]:
    progress = status.get("progress") or {}
    return [c.get("label", "") for c in progress.get("snapshot", {}).get("candidates", [])]


def assert_valid(polls: list[dict[str, Any]]) -> None:
    violations = validate("deferred-operation-status.v2", polls, via="schema")
    assert violations == [], [str(v) for v in violations]


@pytest.mark.asyncio
async def test_scan_sees_devices_added_during_it_and_cancel_is_confirmed_by_stop_discovery(
    bluez: BluezController,
) -> None:
    async with new_manager() as manager:
        operation_id = await start_scan(manager)
        polls = await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        assert bluez.discovering()
        bluez.add_device(STRAP, name="strap-1", service_uuids=[HEART], rssi=-60)
        bluez.add_device(STRANGER, name="stranger", service_uuids=[], rssi=-40)
        bluez.update(STRAP, rssi=-55)
        polls += await poll_until(manager, operation_id, lambda s: snapshot_labels(s) == ["strap-1"])
        cancelled_status = await cancelled(manager, operation_id)
        assert cancelled_status["status"] in ("running", "cancelled")
        polls += [cancelled_status]
        polls += await poll_until(manager, operation_id, lambda s: s["status"] == "cancelled")
        final = polls[-1]
        assert final["cancellation"]["state"] == "confirmed"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert not bluez.discovering()
        assert len(bluez.method_calls("StopDiscovery")) == 1
        assert manager.claims.holder(claim_key("ble", "hci0")) is None
        assert "stranger" not in repr(polls) and STRANGER not in repr(polls) and STRAP not in repr(polls)
        assert_valid(polls)


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["refused", "never-answered"])
async def test_an_unacknowledged_stop_cancels_with_stop_by_disconnect(
    bluez: BluezController, fault: str
) -> None:
    async with new_manager() as manager:
        operation_id = await start_scan(manager)
        polls = await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        assert len(bluez.clients()) == 1
        if fault == "refused":
            bluez.fail_stop("org.bluez.Error.Failed", "Operation failed")
        else:
            bluez.stall_stop(bluez.clients()[0])
        polls.append(await cancelled(manager, operation_id))
        # Terminal although the stop is never acknowledged: the proof by disconnect ended it.
        polls += await poll_until(manager, operation_id, lambda s: s["status"] not in ("pending", "running"))
        final = polls[-1]
        assert final["status"] == "cancelled"
        assert final["cancellation"]["state"] == "confirmed"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert final["diagnostics"] == [{"code": "stop-by-disconnect"}]
        await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
        assert bluez.clients() == [] and not bluez.discovering()  # the sender's session is gone
        assert manager.claims.holder(claim_key("ble", "hci0")) is None
        assert_valid(polls)


@pytest.mark.asyncio
async def test_a_wedged_bluetoothd_holds_the_claim_until_it_answers(bluez: BluezController) -> None:
    async with new_manager() as manager:
        operation_id = await start_scan(manager)
        polls = await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        bluez.wedge()
        polls.append(await cancelled(manager, operation_id))
        polls += await poll_until(manager, operation_id, lambda s: s["status"] not in ("pending", "running"))
        final = polls[-1]
        assert final["status"] == "failed"
        assert final["error"]["code"] == "cancellation-unconfirmed"
        assert final["cancellation"]["state"] == "uncertain"
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        assert manager.claims.holder(claim_key("ble", "hci0")) == operation_id
        assert_valid(polls)
        # A new scan on that adapter (named, or the default resolving to it) is refused before any start.
        for adapter in ("hci0", None):
            with pytest.raises(AdmissionError) as refused:
                await start_scan(manager, adapter=adapter)
            assert refused.value.code == "transport-claimed" and refused.value.http_status == 409
            assert refused.value.retry_after_seconds is not None and refused.value.retry_after_seconds >= 1
        bluez.unwedge()  # bluetoothd handles the disconnect; the background retry's round trip answers
        with anyio.fail_after(5):
            while manager.claims.holder(claim_key("ble", "hci0")) is not None:
                await anyio.sleep(0.05)  # real peer: the background retry runs against the emulator process
        after = await status_of(manager, operation_id)
        assert after["status"] == "failed"  # a terminal status never changes
        assert after["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert after["diagnostics"] == [{"code": "stop-by-disconnect"}]
        await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
        assert bluez.clients() == []


@pytest.mark.asyncio
async def test_a_start_cut_off_while_bluetoothd_hangs_holds_the_claim_until_proven(
    bluez: BluezController,
) -> None:
    bluez.wedge_after_start()  # StartDiscovery took effect, but its reply never comes
    begun = asyncio.ensure_future(BleProvider().start(SCOPE, RecordingSink()))
    await bluez.called("StartDiscovery", unless=begun)
    async with new_manager() as manager:
        operation_id = await start_scan(manager, timeout_ms=500, provider=_BegunEarly(begun))
        polls = await poll_until(manager, operation_id, lambda s: s["status"] not in ("pending", "running"))
        final = polls[-1]
        assert final["status"] == "failed"
        assert final["error"]["code"] == "cleanup-unconfirmed"
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        assert manager.claims.holder(claim_key("ble", "hci0")) == operation_id
        assert len(bluez.clients()) == 1  # the killed worker's discovery session: bluetoothd is wedged
        assert_valid(polls)
        bluez.unwedge()  # bluetoothd handles the disconnect; the background retry's proof holds
        with anyio.fail_after(5):
            while manager.claims.holder(claim_key("ble", "hci0")) is not None:
                await anyio.sleep(0.05)  # real peer: the background retry runs against the emulator process
        after = await status_of(manager, operation_id)
        assert after["status"] == "failed"
        assert after["cleanup"] == {"state": "confirmed", "claim": "released"}
        await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
        assert bluez.clients() == []


@pytest.mark.asyncio
async def test_two_scans_on_one_adapter_run_as_two_bluez_clients(bluez: BluezController) -> None:
    async with new_manager() as manager:
        named = await start_scan(manager, window_ms=2000, adapter="hci0")
        default = await start_scan(manager, window_ms=2000)
        for operation_id in (named, default):
            await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        clients = bluez.clients()
        assert len(clients) == 2 and len(set(clients)) == 2
        bluez.add_device(STRAP, name="strap-1", service_uuids=[HEART])
        finals = []
        for operation_id in (named, default):
            polls = await poll_until(
                manager, operation_id, lambda s: s["status"] not in ("pending", "running")
            )
            finals.append(polls[-1])
            assert_valid(polls)
        for final in finals:
            assert final["status"] == "completed"
            assert [c["label"] for c in final["result"]["candidates"]] == ["strap-1"]
            assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        await bluez.settled()  # the kernel answered the stop a disconnect made bluetoothd send
        assert bluez.clients() == []
        assert len(bluez.calls("StartDiscovery")) == 2 and all(
            row[0] in clients for row in bluez.calls("StartDiscovery")
        )


@pytest.mark.asyncio
@pytest.mark.usefixtures("every_advert")
async def test_a_steady_device_stays_present_for_three_ttls(bluez: BluezController) -> None:
    ttl_s = 2  # times are whole seconds: 2 s is the shortest sure TTL
    profile = replace(PROFILE, candidate_ttl_seconds=ttl_s)
    async with new_manager() as manager:
        # A window well beyond three TTLs: a slow start still leaves three TTLs to watch.
        operation_id = await start_scan(manager, window_ms=10_000, profile=profile)
        await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        data = {0x004C: b"\x02\x15"}
        bluez.add_device(STRAP, name="strap-1", service_uuids=[HEART], rssi=-60, manufacturer_data=data)
        await poll_until(manager, operation_id, lambda s: snapshot_labels(s) == ["strap-1"], limit_s=8)
        present_since = last_present = time.monotonic()
        while True:
            # The same advert at the same strength: signalled only because the session asked for every report.
            bluez.advertise(STRAP, rssi=-61, manufacturer_data=data)
            status = await status_of(manager, operation_id)
            if status["status"] != "running":
                break
            assert snapshot_labels(status) == ["strap-1"]
            last_present = time.monotonic()
            await anyio.sleep(0.25)  # real peer: the window runs on real time
        assert status["status"] == "completed"
        assert [c["label"] for c in status["result"]["candidates"]] == ["strap-1"]
        assert last_present - present_since >= 3 * ttl_s  # present at every poll over three TTLs


@pytest.mark.asyncio
async def test_a_steady_device_reported_once_per_controller_cycle_is_kept_for_the_whole_window(
    bluez: BluezController,
) -> None:
    # A 10.24 s controller cycle, a 30 s TTL and a 45 s window, all shortened tenfold (TTLs are whole
    # seconds: 3 s): the controller's duplicate filter lets one report through per cycle.
    bluez.configure(cycle_s=1.024)
    profile = replace(PROFILE, candidate_ttl_seconds=3)
    async with new_manager() as manager:
        operation_id = await start_scan(manager, window_ms=4_500, profile=profile)
        await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        bluez.add_device(STRAP, name="strap-1", service_uuids=[HEART], rssi=-60)
        passed, seen = 0, False
        while True:
            passed += bluez.advertise(STRAP, rssi=-61)  # it advertises on; the controller filters
            status = await status_of(manager, operation_id)
            if status["status"] != "running":
                break
            if snapshot_labels(status):
                assert snapshot_labels(status) == ["strap-1"]
                seen = True
            else:
                assert not seen, "the device dropped out of the snapshot"
            await anyio.sleep(0.1)  # real peer: a device advertising every 100 ms
        assert status["status"] == "completed"
        assert [c["label"] for c in status["result"]["candidates"]] == ["strap-1"]
        assert 1 <= passed <= 6  # one report per cycle (at most about four cycles), not one per advert


@pytest.mark.asyncio
async def test_a_worker_crash_fails_its_session_only_and_releases_the_claim_after_the_proof(
    bluez: BluezController,
) -> None:
    async with new_manager() as manager:
        doomed = await start_scan(manager)
        healthy = await start_scan(manager, window_ms=3000)
        for operation_id in (doomed, healthy):
            await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        assert len(bluez.clients()) == 2
        session = manager._sessions[doomed]._provider_session
        assert isinstance(session, BleSession) and session.worker_pid is not None
        os.kill(session.worker_pid, signal.SIGKILL)
        polls = await poll_until(manager, doomed, lambda s: s["status"] not in ("pending", "running"))
        final = polls[-1]
        assert final["status"] == "failed" and final["error"]["code"] == "provider-failure"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert final["diagnostics"] == [{"code": "stop-by-disconnect"}]
        assert len(bluez.clients()) == 1
        bluez.add_device(STRAP, name="strap-1", service_uuids=[HEART])
        polls = await poll_until(manager, healthy, lambda s: s["status"] not in ("pending", "running"))
        assert polls[-1]["status"] == "completed"
        assert snapshot_labels(polls[-1]) == ["strap-1"]
        assert_valid(polls)


_CONNECTOR = """
import asyncio, sys
from connector.core.scope import DiscoveryScope, ScopeFilter
from connector.errors import AdmissionError
from providers.ble import BleProvider, BleSession

class Sink:
    def observe(self, observation): pass
    def fail(self, error): pass

async def main():
    scope = DiscoveryScope("ble", 10, 64, 65536, ScopeFilter(name_prefix="x"), cleanup_timeout_ms=300)
    session = await BleProvider().start(scope, Sink())
    print(session.worker_pid, flush=True)
    await asyncio.sleep(60)  # real peer: this child only waits to be killed

asyncio.run(main())
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie waits for init to reap it: not running


def test_a_sigkilled_connector_leaves_no_worker_behind(bluez: BluezController) -> None:
    connector = subprocess.Popen(
        [sys.executable, "-c", _CONNECTOR], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert connector.stdout is not None
        worker = int(connector.stdout.readline())
        assert _alive(worker) and len(bluez.clients()) == 1
        connector.kill()
        connector.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.02)  # real peer: polls a real worker process
        assert not _alive(worker)
        while bluez.clients() and time.monotonic() < deadline:
            time.sleep(0.02)  # real peer: polls the emulator process
        assert bluez.clients() == []  # its connection closed with it: bluetoothd dropped the session
    finally:
        connector.kill()
        connector.wait(timeout=10)
        if connector.stdout is not None:
            connector.stdout.close()


@pytest.mark.asyncio
async def test_powered_off_adapter_fails_the_session_with_provider_unavailable(
    bluez: BluezController,
) -> None:
    async with new_manager() as manager:
        bluez.set_powered(False)
        operation_id = await start_scan(manager)
        polls = await poll_until(manager, operation_id, lambda s: s["status"] not in ("pending", "running"))
        assert polls[-1]["status"] == "failed"
        assert polls[-1]["error"]["code"] == "provider-unavailable"
        assert polls[-1]["cleanup"]["claim"] == "released"
        assert_valid(polls)


@pytest.mark.asyncio
async def test_adapter_powered_off_mid_scan_fails_provider_restarted_and_drops_the_generation(
    bluez: BluezController,
) -> None:
    async with new_manager() as manager:
        operation_id = await start_scan(manager)
        await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        bluez.add_device(STRAP, name="strap-1", service_uuids=[HEART])
        bluez.update(STRAP, rssi=-50)
        await poll_until(manager, operation_id, lambda s: snapshot_labels(s) == ["strap-1"])
        bluez.set_powered(False)
        polls = await poll_until(manager, operation_id, lambda s: s["status"] not in ("pending", "running"))
        assert polls[-1]["status"] == "failed"
        assert polls[-1]["error"]["code"] == "provider-restarted"
        assert "progress" not in polls[-1] and "result" not in polls[-1]


@pytest.mark.asyncio
async def test_window_end_completes_with_the_final_snapshot_as_result(bluez: BluezController) -> None:
    async with new_manager() as manager:
        operation_id = await start_scan(manager, window_ms=1500)
        await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        bluez.add_device(STRAP, name="strap-1", service_uuids=[HEART])
        bluez.update(STRAP, rssi=-50)
        polls = await poll_until(manager, operation_id, lambda s: s["status"] == "completed")
        final = polls[-1]
        assert final["result"]["reason"] == "window-complete"
        assert [c["label"] for c in final["result"]["candidates"]] == ["strap-1"]
        assert final["result"]["candidates"] == final["progress"]["snapshot"]["candidates"]
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert not bluez.discovering()
        assert_valid(polls)
