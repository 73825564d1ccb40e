"""Cancellation outcomes (CONTRACT §6.7): confirmed, stop raises, stop hangs, late acknowledgement; claims."""

from __future__ import annotations

from typing import Any

import pytest

from connector.errors import AdmissionError
from connector.runtime.claims import claim_key
from connector.runtime.manager import DiscoveryManager
from connector.timer import VirtualTimer
from providers.faults import HANG, RAISE, Fault, FaultProvider, StopStep
from tests.runtime.sessions import assert_valid_polls, drive_until, fast_manager, poll_to_end, start
from tests.runtime.support import ble_scope, strap

STRAPS = [(i * 20, strap(i)) for i in range(5)]


async def until_revision(manager: DiscoveryManager, timer: VirtualTimer, operation_id: str) -> dict[str, Any]:
    """Run until the first revision (so that cancelling has something to hide)."""
    await drive_until(timer, lambda: "progress" in manager.status(operation_id), every_ms=5)
    return manager.status(operation_id)


@pytest.mark.asyncio
async def test_cancel_is_requested_until_the_stop_acknowledges_then_cancelled() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(StopStep("ack", delay_ms=150),)), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=5_000, timer=timer)
        before = await until_revision(manager, timer, handle.operation_id)
        during = manager.cancel(handle.operation_id)
        assert during["status"] == "running"
        assert during["cancellation"]["state"] == "requested" and "requested_at" in during["cancellation"]
        assert "progress" not in during and "confirmed_at" not in during["cancellation"]
        assert during["cleanup"] == {"state": "pending", "claim": "held"}
        again = manager.cancel(handle.operation_id)
        assert again["cancellation"] == during["cancellation"]
        polls = [before, during, again, *await poll_to_end(manager, handle.operation_id, timer=timer)]
        final = polls[-1]
        assert final["status"] == "cancelled"
        assert final["cancellation"]["state"] == "confirmed" and "confirmed_at" in final["cancellation"]
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert "progress" not in final and "result" not in final
        assert all("progress" not in p for p in polls[1:])
        assert provider.calls == ["start", "stop", "stop-ack"]
        assert manager.claims.holder(claim_key("ble", None)) is None
        assert manager.cancel(handle.operation_id) == manager.status(handle.operation_id)
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_cancel_whose_stop_raises_is_cancellation_unconfirmed_and_keeps_the_claim() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(RAISE,)), timer=timer)
    async with fast_manager(cleanup_retry_initial_s=10.0, timer=timer) as manager:
        handle = await start(manager, provider, window_ms=5_000, timer=timer)
        await until_revision(manager, timer, handle.operation_id)
        manager.cancel(handle.operation_id)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "failed" and final["error"]["code"] == "cancellation-unconfirmed"
        assert final["cancellation"]["state"] == "uncertain"
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        assert manager.claims.holder(claim_key("ble", None)) == handle.operation_id
        assert_valid_polls(polls)

        second = FaultProvider(STRAPS, timer=timer)
        with pytest.raises(AdmissionError) as refused:
            await start(manager, second, timer=timer)
        assert refused.value.code == "transport-claimed" and (refused.value.retry_after_seconds or 0) >= 1
        assert second.calls == [], "a refused scan never reaches its provider"
    await provider.unplug()  # the stop never acknowledged: end the player it left


@pytest.mark.asyncio
async def test_cancel_whose_stop_hangs_is_bounded_then_a_late_ack_releases_the_claim() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(HANG, HANG, StopStep("ack"))), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=5_000, timer=timer)
        await until_revision(manager, timer, handle.operation_id)
        manager.cancel(handle.operation_id)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        # Terminal although the stop never answers: it was cut (cleanup_timeout_ms), hence uncertain.
        assert final["status"] == "failed" and final["error"]["code"] == "cancellation-unconfirmed"
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        assert manager.claims.holder(claim_key("ble", None)) == handle.operation_id
        await drive_until(timer, lambda: manager.claims.holder(claim_key("ble", None)) is None)
        later = manager.status(handle.operation_id)
        assert later["status"] == "failed" and later["error"]["code"] == "cancellation-unconfirmed"
        assert later["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert provider.stop_calls == 3 and provider.acknowledged_stops == 1
        assert_valid_polls([*polls, later])
        follow_up = await start(manager, FaultProvider(STRAPS, timer=timer), window_ms=50, timer=timer)
        assert (await poll_to_end(manager, follow_up.operation_id, timer=timer))[-1]["status"] == "completed"


@pytest.mark.asyncio
async def test_the_background_retry_outlives_the_callers_interest() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(RAISE, RAISE, StopStep("ack"))), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=5_000, timer=timer)
        await until_revision(manager, timer, handle.operation_id)
        manager.cancel(handle.operation_id)
        # Nobody polls any more (the caller lost its grant, say); the claim is still released eventually.
        await drive_until(timer, lambda: manager.claims.holder(claim_key("ble", None)) is None)
        assert provider.acknowledged_stops == 1


@pytest.mark.asyncio
async def test_cancel_while_pending_ends_cancelled_once_the_started_session_stopped() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(start_delay_ms=100), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=5_000, timer=timer)
        during = manager.cancel(handle.operation_id)
        assert during["status"] == "pending" and during["cancellation"]["state"] == "requested"
        polls = [during, *await poll_to_end(manager, handle.operation_id, timer=timer)]
        assert polls[-1]["status"] == "cancelled"
        assert "running" not in [p["status"] for p in polls]
        assert provider.calls == ["start", "stop", "stop-ack"]
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_a_held_claim_refuses_before_any_provider_call_but_shared_backends_run_together() -> None:
    timer = VirtualTimer()
    async with fast_manager(timer=timer) as manager:
        first = FaultProvider(STRAPS, timer=timer)
        await start(manager, first, window_ms=400, timer=timer)
        refused_provider = FaultProvider(STRAPS, timer=timer)
        with pytest.raises(AdmissionError) as refused:
            await start(manager, refused_provider, timer=timer)
        assert refused.value.code == "transport-claimed"
        assert refused_provider.calls == []
        other_adapter = FaultProvider(STRAPS, timer=timer)
        await start(manager, other_adapter, scope=ble_scope(adapter="hci1"), window_ms=100, timer=timer)
        shared = [FaultProvider(STRAPS, concurrent_sessions=True, timer=timer) for _ in range(2)]
        handles = [await start(manager, p, window_ms=100, timer=timer) for p in shared]
        for handle in handles:
            polls = await poll_to_end(manager, handle.operation_id, timer=timer)
            assert polls[-1]["status"] == "completed"
        assert all(p.acknowledged_stops == 1 for p in shared)


@pytest.mark.asyncio
async def test_a_cancel_during_the_final_stop_of_a_window_end_wins() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(StopStep("ack", delay_ms=150),)), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=150, timer=timer)
        await drive_until(timer, lambda: provider.stop_calls > 0, every_ms=10)
        during = manager.cancel(handle.operation_id)
        assert during["status"] == "running" and "progress" not in during
        polls = [during, *await poll_to_end(manager, handle.operation_id, timer=timer)]
        assert polls[-1]["status"] == "cancelled"
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_a_revocation_during_the_final_stop_ends_grant_revoked() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(StopStep("ack", delay_ms=150),)), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=150, timer=timer)
        await drive_until(timer, lambda: provider.stop_calls > 0, every_ms=10)
        assert manager.revoke_owner("alice") == [handle.operation_id]
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        assert polls[-1]["status"] == "failed" and polls[-1]["error"]["code"] == "grant-revoked"
        assert all("progress" not in p for p in polls)
        assert_valid_polls(polls)
