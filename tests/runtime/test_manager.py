"""The manager: revisions under load, long polls, flood privacy, disclosure counts, retention, shutdown."""

from __future__ import annotations

import logging
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.core.scope import ScopeFilter
from connector.core.snapshot import CandidateTable, Revision
from connector.runtime.manager import UnknownOperation
from providers.faults import Fault, FaultProvider, StopStep
from providers.replay import ReplayProvider
from tests.runtime.sessions import (
    assert_valid_polls,
    delivered_status,
    dumps,
    fast_manager,
    poll_to_end,
    start,
    with_profile,
)
from tests.runtime.support import ble_scope, other_tasks, stranger, strap

STRAPS = [(i * 20, strap(i)) for i in range(5)]
CANARY = "CANARY-d41c"


@pytest.mark.asyncio
async def test_revisions_strictly_increase_under_a_crowd_and_concurrent_polls(fixtures_dir: Path) -> None:
    provider = ReplayProvider(fixtures_dir / "ble-office-crowd.jsonl", speed=25.0)
    scope = ble_scope(filters=ScopeFilter(manufacturer_ids=(0x0006,)), max_candidates=64)
    pollers: list[list[dict[str, Any]]] = [[] for _ in range(4)]
    async with fast_manager() as manager:
        handle = await start(manager, provider, scope=scope, window_ms=1_000)

        async def poll(into: list[dict[str, Any]], every_s: float) -> None:
            while True:
                into.append(manager.status(handle.operation_id))
                if into[-1]["status"] not in ("pending", "running"):
                    return
                await anyio.sleep(every_s)

        async def long_poll(into: list[dict[str, Any]]) -> None:
            revision = 0
            while True:
                status = await manager.wait_for_change(handle.operation_id, revision, 0.5)
                into.append(status)
                if status["status"] not in ("pending", "running"):
                    return
                revision = status.get("progress", {}).get("revision", revision)

        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:
                group.start_soon(poll, pollers[0], 0.02)
                group.start_soon(poll, pollers[1], 0.023)
                group.start_soon(long_poll, pollers[2])
                group.start_soon(long_poll, pollers[3])
    for polls in pollers:
        assert len(polls) < 400, "keep the schema check of every poll affordable"
        revisions = [p["progress"]["revision"] for p in polls if "progress" in p]
        assert revisions == sorted(revisions) and len(set(revisions)) > 3
        assert polls[-1]["status"] == "completed"
        assert_valid_polls(polls)
    long_polled = [p["progress"]["revision"] for p in pollers[2][:-1] if "progress" in p]
    assert all(b > a for a, b in pairwise(long_polled)), "each long poll sees a newer one"
    merged = sorted(
        (p for polls in pollers for p in polls if "progress" in p), key=lambda p: p["progress"]["revision"]
    )
    by_revision: dict[int, str] = {}
    for status in merged:
        snapshot = dumps(status["progress"]["snapshot"])
        assert by_revision.setdefault(status["progress"]["revision"], snapshot) == snapshot


@pytest.mark.asyncio
async def test_revisions_are_coalesced_to_the_minimum_interval() -> None:
    burst = [(i, strap(i % 3, rssi=-40 - i % 20)) for i in range(400)]
    async with fast_manager() as manager:
        handle = await start(
            manager, FaultProvider(burst), profile=with_profile(min_revision_interval_ms=200), window_ms=500
        )
        polls = await poll_to_end(manager, handle.operation_id, every_s=0.005)
        assert polls[-1]["result"]["final_revision"] <= 4


@pytest.mark.asyncio
async def test_an_out_of_scope_flood_leaves_no_trace(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    fault = Fault(flood=lambda i: stranger(i, name=CANARY), flood_count=5_000, flood_at_ms=10)
    provider = FaultProvider(STRAPS[:2], fault=fault)
    async with fast_manager() as manager:
        handle = await start(manager, provider, window_ms=300)
        polls = await poll_to_end(manager, handle.operation_id)
        metadata = manager.metadata(handle.operation_id)
    final = polls[-1]
    assert sorted(c["label"] for c in final["result"]["candidates"]) == ["strap-0", "strap-1"]
    assert metadata["disclosed_count"] == 2
    for document in [*polls, metadata]:
        assert CANARY not in dumps(document) and "06:00:00" not in dumps(document)
    assert all(CANARY not in record.getMessage() for record in caplog.records)
    assert all(CANARY not in str(record.args) for record in caplog.records)
    assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_disclosed_count_counts_only_candidates_actually_returned() -> None:
    async with fast_manager() as manager:
        handle = await start(manager, FaultProvider(STRAPS), window_ms=200)
        await handle_finished(manager, handle.operation_id)
        assert manager.metadata(handle.operation_id)["disclosed_count"] == 0
        manager.status(handle.operation_id)
        assert manager.metadata(handle.operation_id)["disclosed_count"] == 0, "a read never counts"
        delivered_status(manager, handle.operation_id)
        delivered_status(manager, handle.operation_id)
        metadata = manager.metadata(handle.operation_id)
        assert metadata["disclosed_count"] == 5
        assert "progress" not in metadata and "result" not in dumps(metadata).replace('"result_', "")
        for label in ("strap-0", "02:00:00", "candidate/ref"):
            assert label not in dumps(metadata)


async def handle_finished(manager: Any, operation_id: str) -> None:
    session = manager._get(operation_id)
    with anyio.fail_after(3):
        await session.finished.wait()


@pytest.mark.asyncio
async def test_long_poll_wakes_on_a_new_revision_and_returns_at_timeout_otherwise() -> None:
    provider = FaultProvider([(100, strap(1))])
    async with fast_manager() as manager:
        handle = await start(manager, provider, window_ms=3_000)
        # The waits that must wake early get a long timeout: returning well before it is the proof.
        started = anyio.current_time()
        status = await manager.wait_for_change(handle.operation_id, 0, 30.0)
        assert status["progress"]["revision"] == 1
        assert anyio.current_time() - started < 15
        started = anyio.current_time()
        quiet = await manager.wait_for_change(handle.operation_id, 1, 0.15)
        # Still running: it returned at its own timeout, not at the window's end.
        assert quiet["progress"]["revision"] == 1 and quiet["status"] == "running"
        assert anyio.current_time() - started >= 0.14
        manager.cancel(handle.operation_id)
        started = anyio.current_time()
        terminal = await manager.wait_for_change(handle.operation_id, None, 30.0)
        assert terminal["status"] == "cancelled" and anyio.current_time() - started < 15


@pytest.mark.asyncio
async def test_a_completed_result_is_erased_after_its_retention() -> None:
    profile = with_profile(result_retention_seconds=1)
    async with fast_manager() as manager:
        handle = await start(manager, FaultProvider(STRAPS), profile=profile, window_ms=150)
        polls = await poll_to_end(manager, handle.operation_id)
        final = polls[-1]
        ref = next(c["candidate/ref"] for c in final["result"]["candidates"] if c["label"] == "strap-3")
        assert handle.binding_target(ref) == ("ble", "02:00:00:00:00:03")
        with anyio.fail_after(3):
            while "erased_at" not in manager.status(handle.operation_id)["result"]:
                await anyio.sleep(0.05)
        erased = manager.status(handle.operation_id)
        assert erased["status"] == "completed" and "progress" not in erased
        assert erased["result"]["candidates"] == []
        assert erased["result"]["final_revision"] == final["result"]["final_revision"]
        assert erased["result"]["reason"] == final["result"]["reason"]
        assert handle.binding_target(ref) is None
        assert_valid_polls([*polls, erased])


@pytest.mark.asyncio
async def test_metadata_retention_forgets_the_operation() -> None:
    async with fast_manager(metadata_retention_seconds=0) as manager:
        handle = await start(
            manager, FaultProvider([]), profile=with_profile(result_retention_seconds=0), window_ms=50
        )
        with anyio.fail_after(10):
            while handle.operation_id in list(manager.operation_ids()):
                await anyio.sleep(0.02)
        with pytest.raises(UnknownOperation) as unknown:
            manager.status(handle.operation_id)
        assert unknown.value.code == "unknown-operation"


@pytest.mark.asyncio
async def test_revoking_a_grant_erases_and_ends_that_owners_sessions() -> None:
    async with fast_manager() as manager:
        mine = await start(manager, FaultProvider(STRAPS), window_ms=5_000, owner="alice")
        theirs = await start(
            manager, FaultProvider(STRAPS, concurrent_sessions=True), window_ms=300, owner="bob"
        )
        await manager.wait_for_change(mine.operation_id, 0, 2.0)
        assert manager.active_operations("alice") == 1
        assert manager.revoke_owner("alice") == [mine.operation_id]
        right_after = manager.status(mine.operation_id)
        assert "progress" not in right_after
        polls = [right_after, *await poll_to_end(manager, mine.operation_id)]
        assert polls[-1]["status"] == "failed" and polls[-1]["error"]["code"] == "grant-revoked"
        assert polls[-1]["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert (await poll_to_end(manager, theirs.operation_id))[-1]["status"] == "completed"
        assert manager.active_operations("alice") == 0
        assert_valid_polls(polls)


@pytest.mark.asyncio
async def test_aclose_stops_every_live_session_with_a_confirmed_stop() -> None:
    providers = [
        FaultProvider(
            STRAPS, concurrent_sessions=True, fault=Fault(stop_plan=(StopStep("ack", delay_ms=50),))
        )
        for _ in range(3)
    ]
    async with fast_manager() as manager:
        handles = [await start(manager, p, window_ms=10_000) for p in providers]
        await manager.wait_for_change(handles[0].operation_id, 0, 2.0)
        with anyio.fail_after(10):
            await manager.aclose()
        for handle in handles:
            final = manager.status(handle.operation_id)
            assert final["status"] == "failed" and final["error"]["code"] == "interrupted-by-restart"
            assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert all(p.acknowledged_stops == 1 for p in providers)
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_unknown_operations_and_a_closed_runtime() -> None:
    manager = fast_manager()
    with pytest.raises(UnknownOperation):
        manager.status("deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA")
    with pytest.raises(Exception, match="not running") as refused:
        await start(manager, FaultProvider([]))
    assert getattr(refused.value, "code", None) == "internal"


@pytest.mark.asyncio
async def test_an_internal_error_ends_only_that_session_and_logs_no_detail(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    broken, healthy = FaultProvider(STRAPS), FaultProvider(STRAPS, concurrent_sessions=True)
    async with fast_manager() as manager:
        bad = await start(manager, broken, window_ms=2_000)
        good = await start(manager, healthy, window_ms=300)

        class Exploding(CandidateTable):
            __slots__ = ()

            def cut(self, now_ms: int, *, final: bool = False) -> Revision | None:
                raise RuntimeError(CANARY)

        manager._get(bad.operation_id).table.__class__ = Exploding
        bad_polls = await poll_to_end(manager, bad.operation_id)
        good_polls = await poll_to_end(manager, good.operation_id)
    assert bad_polls[-1]["status"] == "failed" and bad_polls[-1]["error"]["code"] == "provider-failure"
    assert bad_polls[-1]["cleanup"] == {"state": "confirmed", "claim": "released"}
    assert broken.acknowledged_stops == 1
    assert good_polls[-1]["status"] == "completed"
    assert any("RuntimeError" in record.getMessage() for record in caplog.records)
    assert all(CANARY not in record.getMessage() and record.exc_info is None for record in caplog.records)
    assert_valid_polls(bad_polls)


@pytest.mark.asyncio
async def test_a_long_poll_during_a_pending_cancel_waits_for_the_end_instead_of_spinning() -> None:
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(StopStep("ack", delay_ms=160),)))
    async with fast_manager() as manager:
        handle = await start(manager, provider, window_ms=5_000)
        first = await manager.wait_for_change(handle.operation_id, 0, 2.0)
        manager.cancel(handle.operation_id)
        started = anyio.current_time()
        quiet = await manager.wait_for_change(handle.operation_id, 0, 0.1)
        assert quiet["cancellation"]["state"] == "requested" and "progress" not in quiet
        assert anyio.current_time() - started >= 0.09, "an invisible revision does not end the wait"
        final = await manager.wait_for_change(handle.operation_id, None, 2.0)
        assert final["status"] == "cancelled"
        assert_valid_polls([first, quiet, final])


@pytest.mark.asyncio
async def test_durable_updated_at_does_not_follow_revision_timing() -> None:
    # Devices arriving at 50, 150 and 250 ms cut three revisions; their timing is candidate-derived, so
    # the durable projection's `updated_at` moves only with lifecycle changes (start, end).
    timeline = [(50, strap(0)), (150, strap(1)), (250, strap(2))]
    async with fast_manager() as manager:
        handle = await start(
            manager, FaultProvider(timeline), profile=with_profile(min_revision_interval_ms=50), window_ms=400
        )
        seen: list[tuple[int, str]] = []
        with anyio.fail_after(5):
            while (status := manager.status(handle.operation_id))["status"] == "running" or not seen:
                if status["status"] == "running" and "progress" in status:
                    seen.append(
                        (status["progress"]["revision"], manager.metadata(handle.operation_id)["updated_at"])
                    )
                await anyio.sleep(0.01)
    revisions = {revision for revision, _ in seen}
    assert len(revisions) >= 2
    assert len({updated for _, updated in seen}) == 1
