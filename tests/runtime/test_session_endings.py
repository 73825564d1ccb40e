"""Every way a session ends, each with a confirmed or uncertain stop, checked over whole poll sequences."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from connector.contract.canonical import canonical_bytes
from connector.core.clock import parse_time, to_ms
from connector.core.scope import DiscoveryScope
from connector.errors import ProviderUnavailable
from connector.runtime.claims import claim_key
from connector.timer import VirtualTimer
from providers.base import ObservationSink, ProviderCapabilities, stop_bound_ms
from providers.faults import HANG, RAISE, Fault, FaultProvider, StopStep
from tests.runtime.sessions import (
    assert_valid_polls,
    drive_until,
    fast_manager,
    poll_to_end,
    start,
    with_profile,
)
from tests.runtime.support import ble_scope, other_tasks, strap

STRAPS = [(i * 20, strap(i)) for i in range(5)]


def final_snapshot_equals_result(final: dict[str, object]) -> None:
    progress, result = final["progress"], final["result"]
    assert isinstance(progress, dict) and isinstance(result, dict)
    assert result["final_revision"] == progress["revision"]
    assert canonical_bytes(result["candidates"]) == canonical_bytes(progress["snapshot"]["candidates"])


@pytest.mark.asyncio
async def test_window_complete_reports_the_final_snapshot_after_a_confirmed_stop() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=300, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "completed"
        assert final["result"]["reason"] == "window-complete" and final["result"]["partial"] is False
        assert len(final["result"]["candidates"]) == 5
        final_snapshot_equals_result(final)
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert "retry_after_seconds" not in final and final["diagnostics"] == []
        assert final["causal/context"]["trace/id"] == "t-1"
        assert provider.calls == ["start", "stop", "stop-ack"]
        assert manager.claims.holder(claim_key("ble", None)) is None
        assert handle.termination_confirmed
        assert_valid_polls(polls)
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_nothing_in_scope_completes_with_final_revision_zero() -> None:
    timer = VirtualTimer()
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, FaultProvider([], timer=timer), window_ms=100, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "completed" and "progress" not in final
        assert final["result"]["final_revision"] == 0 and final["result"]["candidates"] == []
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_limit_reached_by_count_stops_early_and_keeps_the_first_devices() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(
            manager, provider, scope=ble_scope(max_candidates=2), window_ms=5_000, timer=timer
        )
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "completed"
        # Ended by the limit, not by its window (that reason would be the window's).
        assert final["result"]["reason"] == "limit-reached" and final["result"]["partial"] is True
        labels = sorted(c["label"] for c in final["result"]["candidates"])
        assert labels == ["strap-0", "strap-1"]
        final_snapshot_equals_result(final)
        assert provider.acknowledged_stops == 1
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_limit_reached_by_bytes_never_exceeds_the_bound() -> None:
    timer = VirtualTimer()
    bound = 1_200
    provider = FaultProvider([(i * 5, strap(i, name="x" * 60)) for i in range(20)], timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(
            manager, provider, scope=ble_scope(max_snapshot_bytes=bound), window_ms=5_000, timer=timer
        )
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["result"]["reason"] == "limit-reached"
        assert 0 < len(final["result"]["candidates"]) < 20
        for poll in polls:
            if "progress" in poll:
                assert len(canonical_bytes(poll["progress"]["snapshot"])) <= bound
                assert poll["progress"]["bounds"]["max_snapshot_bytes"] == bound
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_limit_reached_by_max_revisions() -> None:
    timer = VirtualTimer()
    provider = FaultProvider([(i * 120, strap(i)) for i in range(10)], timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(
            manager, provider, profile=with_profile(max_revisions=2), window_ms=5_000, timer=timer
        )
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["result"]["reason"] == "limit-reached"
        assert final["result"]["final_revision"] == 2 == final["progress"]["revision"]
        final_snapshot_equals_result(final)
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_deadline_reached_when_the_callers_deadline_cut_the_window() -> None:
    timer = VirtualTimer()
    async with fast_manager(timer=timer) as manager:
        handle = await start(
            manager, FaultProvider(STRAPS, timer=timer), window_ms=200, cut_by_deadline=True, timer=timer
        )
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["result"]["reason"] == "deadline-reached" and final["result"]["partial"] is True
        final_snapshot_equals_result(final)
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_a_window_end_whose_stop_raises_is_failed_cleanup_unconfirmed_with_the_claim_held() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(RAISE,)), timer=timer)
    async with fast_manager(cleanup_retry_initial_s=10.0, timer=timer) as manager:
        handle = await start(manager, provider, window_ms=150, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "failed"
        assert final["error"]["code"] == "cleanup-unconfirmed"
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        assert "result" not in final and "progress" not in final
        assert manager.claims.holder(claim_key("ble", None)) == handle.operation_id
        assert not handle.termination_confirmed
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_provider_start_failure_fails_without_a_stop() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(fault=Fault(start_error=ProviderUnavailable("no adapter")), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "failed" and final["error"]["code"] == "provider-unavailable"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert provider.calls == ["start"]
        assert manager.claims.holder(claim_key("ble", None)) is None
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_a_session_is_pending_until_its_provider_started() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(start_delay_ms=150), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=400, timer=timer)
        first = manager.status(handle.operation_id)
        assert first["status"] == "pending" and "progress" not in first
        assert first["retry_after_seconds"] >= 1
        polls = [first, *await poll_to_end(manager, handle.operation_id, timer=timer)]
        assert [p["status"] for p in polls].count("running") > 0
        assert polls[-1]["status"] == "completed"
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_a_provider_restart_mid_session_fails_and_drops_the_generation() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(
        STRAPS, fault=Fault(fail_at_ms=1_500), timer=timer
    )  # well after the first running poll
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=4_000, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert any("progress" in p for p in polls), "candidates were visible before the restart"
        assert final["status"] == "failed" and final["error"]["code"] == "provider-restarted"
        assert "progress" not in final and "result" not in final
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        seen = [p for p in polls if "progress" in p][-1]["progress"]["snapshot"]["candidates"]
        assert all(handle.binding_target(c["candidate/ref"]) is None for c in seen)
        assert provider.acknowledged_stops == 1
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_timed_out_when_the_connector_timeout_passes() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=3_000, timeout_ms=200, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "timed-out" and final["error"]["code"] == "deadline-exceeded"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert provider.acknowledged_stops == 1
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_expired_when_expires_at_passes_and_the_stop_still_bounded() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(HANG, StopStep("ack"))), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=3_000, expires_in_ms=200, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "expired" and final["error"]["code"] == "deadline-exceeded"
        # Terminal although the stop never answers: it was cut (cleanup_timeout_ms), hence uncertain.
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        assert_valid_polls(polls)
        await drive_until(timer, lambda: manager.claims.holder(claim_key("ble", None)) is None)
        assert manager.status(handle.operation_id)["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert manager.status(handle.operation_id)["status"] == "expired"


@pytest.mark.asyncio
async def test_a_start_cut_off_by_the_timeout_fails_deadline_exceeded() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(STRAPS, fault=Fault(start_delay_ms=2_000), timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=3_000, timeout_ms=150, timer=timer)
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "failed" and final["error"]["code"] == "deadline-exceeded"
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert_valid_polls(polls)


class _DeafSession:
    """A backend session not built on the base: its first stop never answers, later ones acknowledge."""

    def __init__(self) -> None:
        self.stops = 0

    async def stop(self) -> None:
        self.stops += 1
        if self.stops == 1:
            await anyio.sleep_forever()


class _DeafProvider:
    """Starts `_DeafSession`s (no cleanup bound of its own: only the runtime's backstop cuts its stop)."""

    capabilities = ProviderCapabilities(transport="ble")

    def __init__(self) -> None:
        self.session = _DeafSession()

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> _DeafSession:
        return self.session


@pytest.mark.asyncio
async def test_a_stop_that_never_answers_is_cut_by_the_runtime_backstop() -> None:
    timer = VirtualTimer()
    provider = _DeafProvider()
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=300, timer=timer)
        window_end_ms = timer.now_ms() + 300
        polls = await poll_to_end(manager, handle.operation_id, timer=timer)
        final = polls[-1]
        assert final["status"] == "failed" and final["error"]["code"] == "cleanup-unconfirmed"
        assert final["cleanup"] == {"state": "uncertain", "claim": "held"}
        # Exactly the provider's bound (cleanup + proof) plus the runtime's margin after the window ended.
        assert handle.terminal_at_ms == window_end_ms + stop_bound_ms(ble_scope()) + 250
        await drive_until(timer, lambda: manager.claims.holder(claim_key("ble", None)) is None)
        assert provider.session.stops == 2
        assert_valid_polls(polls)


def _labels(status: dict[str, Any]) -> list[str]:
    return sorted(c["label"] for c in status["progress"]["snapshot"]["candidates"])


@pytest.mark.asyncio
async def test_a_candidate_not_seen_for_its_ttl_leaves_the_snapshot_at_its_expires_at() -> None:
    timer = VirtualTimer()
    # strap-1 is seen once; strap-2 keeps advertising. The TTL is the profile's 30 s.
    timeline = [
        (0, strap(1)),
        *((t_ms, strap(2, rssi=-60 - t_ms // 5_000)) for t_ms in range(0, 45_000, 5_000)),
    ]
    provider = FaultProvider(timeline, timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=45_000, expires_in_ms=60_000, timer=timer)
        op = handle.operation_id
        await timer.advance(1_000)
        (strap_1,) = [
            c for c in manager.status(op)["progress"]["snapshot"]["candidates"] if c["label"] == "strap-1"
        ]
        expires_at_ms = to_ms(parse_time(strap_1["expires_at"]))
        assert expires_at_ms == to_ms(parse_time(strap_1["last_seen_at"])) + 30_000
        await timer.advance_to(expires_at_ms - 1)
        assert _labels(manager.status(op)) == ["strap-1", "strap-2"]
        await timer.advance_to(expires_at_ms)
        assert _labels(manager.status(op)) == ["strap-2"], "gone at the expires_at it showed, not later"
        final = (await poll_to_end(manager, op, every_s=1.0, timer=timer))[-1]
    assert final["status"] == "completed" and [c["label"] for c in final["result"]["candidates"]] == [
        "strap-2"
    ]
