"""Whole discovery sessions on the real BLE provider (bleak, unpatched) against emulated BlueZ.

The runtime turns BlueZ's StopDiscovery answer into the terminal status: acknowledged -> `cancelled`;
refused or stalled -> `failed` `cancellation-unconfirmed` with the claim held until a later acknowledgement.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import anyio
import pytest
from bluez_mock import BluezController, bluez

from connector.contract.validate import validate
from connector.core.ids import OPERATION_KIND, random_operation_id
from connector.core.scope import DiscoveryProfile, DiscoveryScope, ScopeFilter
from connector.runtime.claims import claim_key
from connector.runtime.manager import DiscoveryManager, wall_clock_ms
from providers.ble import BleProvider

__all__ = ["bluez"]  # the fixture, imported above

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


async def start_scan(manager: DiscoveryManager, window_ms: int = 10_000) -> str:
    operation_id = random_operation_id(OPERATION_KIND, secrets.token_bytes(16))
    now = wall_clock_ms()
    await manager.start_scan(
        operation_id=operation_id,
        owner="alice",
        action_id="device.discovery.scan",
        scope=SCOPE,
        profile=PROFILE,
        provider=BleProvider(),
        now_ms=now,
        window_end_ms=now + window_ms,
        cut_by_deadline=False,
        timeout_ms=None,
        expires_at_ms=now + 60_000,
        causal_context=None,
    )
    return operation_id


async def poll_until(
    manager: DiscoveryManager, operation_id: str, predicate: Any, limit_s: float = 5.0
) -> list[dict[str, Any]]:
    """Poll every 20 ms until `predicate(status)`; returns every status seen."""
    polls: list[dict[str, Any]] = []
    with anyio.fail_after(limit_s):
        while True:
            polls.append(manager.status(operation_id))
            if predicate(polls[-1]):
                return polls
            await anyio.sleep(0.02)


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
        cancelled = manager.cancel(operation_id)
        assert cancelled["status"] in ("running", "cancelled")
        polls += [cancelled]
        polls += await poll_until(manager, operation_id, lambda s: s["status"] == "cancelled")
        final = polls[-1]
        assert final["cancellation"]["state"] == "confirmed"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert not bluez.discovering()
        assert len(bluez.method_calls("StopDiscovery")) == 1
        assert manager.claims.holder(claim_key("ble", None)) is None
        assert "stranger" not in repr(polls) and STRANGER not in repr(polls) and STRAP not in repr(polls)
        assert_valid(polls)


@pytest.mark.asyncio
@pytest.mark.parametrize("fault", ["refused", "stalled"])
async def test_unacknowledged_stop_ends_cancellation_unconfirmed_and_holds_the_claim(
    bluez: BluezController, fault: str
) -> None:
    async with new_manager() as manager:
        operation_id = await start_scan(manager)
        polls = await poll_until(manager, operation_id, lambda s: s["status"] == "running")
        if fault == "refused":
            bluez.fail_stop("org.bluez.Error.Failed", "Operation failed")
        else:
            bluez.stall_stop()
        started = time.monotonic()
        polls.append(manager.cancel(operation_id))
        polls += await poll_until(manager, operation_id, lambda s: s["status"] not in ("pending", "running"))
        assert time.monotonic() - started < 2.0  # bounded by cleanup_timeout_ms, not by BlueZ
        final = polls[-1]
        assert final["status"] == "failed"
        assert final["error"]["code"] == "cancellation-unconfirmed"
        assert final["cancellation"]["state"] == "uncertain"
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        assert manager.claims.holder(claim_key("ble", None)) == operation_id
        assert_valid(polls)
        # Only a later acknowledgement releases the claim (the background retry keeps asking BlueZ).
        if fault == "refused":
            bluez.clear_fail_stop()
        else:
            bluez.lift_stall()
        with anyio.fail_after(5):
            while manager.claims.holder(claim_key("ble", None)) is not None:
                await anyio.sleep(0.05)
        after = manager.status(operation_id)
        assert after["status"] == "failed"  # a terminal status never changes
        assert after["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert not bluez.discovering()


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
