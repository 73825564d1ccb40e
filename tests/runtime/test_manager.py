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
from connector.runtime.claims import claim_key
from connector.runtime.manager import DiscoveryManager, SessionClaim
from connector.runtime.session import DiscoverySession
from connector.storage.state import DiscoveryRecord
from connector.timer import VirtualTimer, sleep_ms
from providers.faults import RAISE, Fault, FaultProvider, StopStep
from providers.replay import ReplayProvider
from tests.runtime.sessions import (
    assert_valid_polls,
    delivered_status,
    dumps,
    fast_manager,
    metadata_of,
    poll_to_end,
    start,
    status_of,
    waited,
    with_profile,
)
from tests.runtime.support import ble_scope, on_virtual_time, other_tasks, stranger, strap

STRAPS = [(i * 20, strap(i)) for i in range(5)]
CANARY = "CANARY-d41c"


@pytest.mark.asyncio
async def test_revisions_strictly_increase_under_a_crowd_and_concurrent_polls(fixtures_dir: Path) -> None:
    timer = VirtualTimer()
    provider = ReplayProvider(fixtures_dir / "ble-office-crowd.jsonl", speed=25.0, timer=timer)
    scope = ble_scope(filters=ScopeFilter(manufacturer_ids=(0x0006,)), max_candidates=64)
    pollers: list[list[dict[str, Any]]] = [[] for _ in range(4)]
    ended: list[int] = []
    async with fast_manager(timer) as manager:
        handle = await start(manager, provider, scope=scope, window_ms=1_000, timer=timer)

        async def poll(into: list[dict[str, Any]], every_ms: int) -> None:
            while True:
                into.append(await status_of(manager, handle.operation_id))
                if into[-1]["status"] not in ("pending", "running"):
                    ended.append(every_ms)
                    return
                await sleep_ms(timer, every_ms)

        async def long_poll(into: list[dict[str, Any]]) -> None:
            revision = 0
            while True:
                status = await waited(manager, handle.operation_id, revision, 0.5)
                into.append(status)
                if status["status"] not in ("pending", "running"):
                    ended.append(0)
                    return
                revision = status.get("progress", {}).get("revision", revision)

        async with anyio.create_task_group() as group:
            group.start_soon(poll, pollers[0], 20)
            group.start_soon(poll, pollers[1], 23)
            group.start_soon(long_poll, pollers[2])
            group.start_soon(long_poll, pollers[3])
            await timer.run_until(lambda: len(ended) == 4, limit_ms=5_000)
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
        metadata = metadata_of(manager, handle.operation_id)
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
        assert metadata_of(manager, handle.operation_id)["disclosed_count"] == 0
        await status_of(manager, handle.operation_id)
        assert metadata_of(manager, handle.operation_id)["disclosed_count"] == 0, "a read never counts"
        await delivered_status(manager, handle.operation_id)
        await delivered_status(manager, handle.operation_id)
        metadata = metadata_of(manager, handle.operation_id)
        assert metadata["disclosed_count"] == 5
        assert "progress" not in metadata and "result" not in dumps(metadata).replace('"result_', "")
        for label in ("strap-0", "02:00:00", "candidate/ref"):
            assert label not in dumps(metadata)


async def handle_finished(manager: DiscoveryManager, operation_id: str) -> None:
    session = manager.session(operation_id)
    assert session is not None
    with anyio.fail_after(3):
        await session.finished.wait()


@pytest.mark.asyncio
async def test_long_poll_wakes_on_a_new_revision_and_returns_at_timeout_otherwise() -> None:
    timer = VirtualTimer()
    provider = FaultProvider([(100, strap(1))], timer=timer)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=3_000, timer=timer)
        began = timer.now_ms()
        # The waits that must wake early wake long before their timeout, at the provider's 100 ms.
        status = await on_virtual_time(timer, lambda: waited(manager, handle.operation_id, 0, 30.0))
        assert status["progress"]["revision"] == 1 and timer.now_ms() < began + 1_000
        woke = timer.now_ms()
        async with anyio.create_task_group() as group:
            quiet: list[dict[str, Any]] = []

            async def poll_quietly() -> None:
                quiet.append(await waited(manager, handle.operation_id, 1, 0.15))

            group.start_soon(poll_quietly)
            await timer.advance(149)
            assert quiet == [], "nothing new: it waits its whole timeout"
            await timer.advance(1)
        # Still running: it returned at its own timeout, not at the window's end.
        assert quiet[0]["progress"]["revision"] == 1 and quiet[0]["status"] == "running"
        await manager.cancel(handle.operation_id)
        terminal = await on_virtual_time(timer, lambda: waited(manager, handle.operation_id, None, 30.0))
        assert terminal["status"] == "cancelled" and timer.now_ms() < woke + 150 + 1_000


@pytest.mark.asyncio
async def test_a_completed_result_is_erased_after_its_retention() -> None:
    timer = VirtualTimer()
    profile = with_profile(result_retention_seconds=30)
    async with fast_manager(timer=timer) as manager:
        handle = await start(
            manager, FaultProvider(STRAPS, timer=timer), profile=profile, window_ms=150, timer=timer
        )
        await ended(timer, handle.session, after_ms=150)
        final = await delivered_status(manager, handle.operation_id)
        ref = next(c["candidate/ref"] for c in final["result"]["candidates"] if c["label"] == "strap-3")
        assert handle.session.table.binding_target(ref) == ("ble", "02:00:00:00:00:03")
        ended_at = handle.session.terminal_at_ms
        assert ended_at is not None
        await timer.advance_to(ended_at + 29_999)
        assert handle.session.erased_at_ms is None, "kept for its whole retention"
        await timer.advance(1)
        assert handle.session.erased_at_ms == ended_at + 30_000
        erased = await status_of(manager, handle.operation_id)
        assert erased["status"] == "completed" and "progress" not in erased
        assert erased["result"]["candidates"] == []
        assert erased["result"]["final_revision"] == final["result"]["final_revision"]
        assert erased["result"]["reason"] == final["result"]["reason"]
        assert handle.session.table.binding_target(ref) is None
        assert_valid_polls([final, erased])


@pytest.mark.asyncio
async def test_metadata_retention_forgets_the_operation() -> None:
    timer = VirtualTimer()
    async with fast_manager(timer=timer, metadata_retention_seconds=60) as manager:
        profile = with_profile(result_retention_seconds=10)
        handle = await start(
            manager, FaultProvider([], timer=timer), profile=profile, window_ms=50, timer=timer
        )
        await ended(timer, handle.session, after_ms=50)
        ended_at = handle.session.terminal_at_ms
        assert ended_at is not None
        await timer.advance_to(ended_at + 59_999)
        assert await manager.observe(handle.operation_id) is not None, "the metadata is retained"
        await timer.advance(1)
        assert handle.operation_id not in list(manager.operation_ids())
        assert await manager.status(handle.operation_id) is None
        assert await manager.observe(handle.operation_id) is None


@pytest.mark.asyncio
async def test_a_journal_forgets_at_result_retention_and_keeps_the_row_it_inserted() -> None:
    timer = VirtualTimer()
    journal = RecordingJournal()
    async with fast_manager(timer=timer, journal=journal) as manager:
        profile = with_profile(result_retention_seconds=10)
        handle = await start(
            manager, FaultProvider(STRAPS, timer=timer), profile=profile, window_ms=50, timer=timer
        )
        assert [row.status for row in journal.inserted] == ["pending"], "inserted before the runner ran"
        assert journal.inserted[0].operation_id == handle.operation_id
        await ended(timer, handle.session, after_ms=50)
        await timer.advance(10_000)
        assert handle.operation_id not in list(manager.operation_ids()), "the journal answers from now on"
    statuses = [metadata["status"] for _, metadata in journal.updates]
    assert statuses[-1] == "completed" and "erased_at" in journal.updates[-1][1]


@pytest.mark.asyncio
async def test_an_uncertain_cleanup_is_retried_with_backoff_on_the_timer_until_acknowledged() -> None:
    timer = VirtualTimer()
    provider = FaultProvider(
        STRAPS, fault=Fault(stop_plan=(RAISE, RAISE, RAISE, StopStep("ack"))), timer=timer
    )
    options = {"cleanup_retry_initial_s": 1.0, "cleanup_retry_max_s": 4.0}
    async with fast_manager(timer=timer, **options) as manager:
        handle = await start(manager, provider, window_ms=100, timer=timer)
        await ended(timer, handle.session, after_ms=100)
        assert handle.session.cleanup_uncertain and provider.stop_calls == 1
        retries: list[int] = []
        while (claim := _claim(manager, handle.operation_id)).cleanup_uncertain:
            assert claim.next_retry_ms is not None
            retries.append(claim.next_retry_ms - timer.now_ms())
            await timer.advance_to(claim.next_retry_ms)  # returns once the retry's stop call was answered
            assert provider.stop_calls == len(retries) + 1
        assert retries == [1_000, 2_000, 4_000], "doubling up to the maximum"
        assert provider.acknowledged_stops == 1 and manager.claims.holder(claim_key("ble", None)) is None
        final = await status_of(manager, handle.operation_id)
        assert final["cleanup"] == {"state": "confirmed", "claim": "released"}


@pytest.mark.asyncio
async def test_revoking_a_grant_erases_and_ends_that_owners_sessions() -> None:
    async with fast_manager() as manager:
        mine = await start(manager, FaultProvider(STRAPS), window_ms=5_000, owner="alice")
        theirs = await start(
            manager, FaultProvider(STRAPS, concurrent_sessions=True), window_ms=300, owner="bob"
        )
        await waited(manager, mine.operation_id, 0, 2.0)
        assert not mine.session.is_terminal and manager.active_count() >= 1
        assert manager.revoke_owner("alice") == [mine.operation_id]
        right_after = await status_of(manager, mine.operation_id)
        assert "progress" not in right_after
        polls = [right_after, *await poll_to_end(manager, mine.operation_id)]
        assert polls[-1]["status"] == "failed" and polls[-1]["error"]["code"] == "grant-revoked"
        assert polls[-1]["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert (await poll_to_end(manager, theirs.operation_id))[-1]["status"] == "completed"
        assert manager.active_count() == 0
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
        await waited(manager, handles[0].operation_id, 0, 2.0)
        with anyio.fail_after(10):
            await manager.aclose()
        for handle in handles:
            final = await status_of(manager, handle.operation_id)
            assert final["status"] == "failed" and final["error"]["code"] == "interrupted-by-restart"
            assert final["cleanup"] == {"state": "confirmed", "claim": "released"}
        assert all(p.acknowledged_stops == 1 for p in providers)
    assert other_tasks() == set()


@pytest.mark.asyncio
async def test_unknown_operations_and_a_closed_runtime() -> None:
    manager = fast_manager()
    unknown = "deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA"
    assert await manager.status(unknown) is None and await manager.cancel(unknown) is None
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

        bad.session.table.__class__ = Exploding
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
    timer = VirtualTimer()
    # The stop takes real time (the provider's): long enough that the virtual wait ends first.
    provider = FaultProvider(STRAPS, fault=Fault(stop_plan=(StopStep("ack", delay_ms=500),)), timer=timer)
    scope = ble_scope(cleanup_timeout_ms=5_000)  # the slow stop is still an acknowledged one
    profile = with_profile(cleanup_timeout_ms=5_000)
    async with fast_manager(timer=timer) as manager:
        handle = await start(manager, provider, window_ms=5_000, timer=timer, scope=scope, profile=profile)
        first = await on_virtual_time(timer, lambda: waited(manager, handle.operation_id, 0, 2.0))
        await manager.cancel(handle.operation_id)
        async with anyio.create_task_group() as group:
            quiet: list[dict[str, Any]] = []

            async def poll_quietly() -> None:
                quiet.append(await waited(manager, handle.operation_id, 0, 0.1))

            group.start_soon(poll_quietly)
            await timer.advance(99)
            assert quiet == [], "an invisible revision does not end the wait"
            await timer.advance(1)
        assert quiet[0]["cancellation"]["state"] == "requested" and "progress" not in quiet[0]
        final = await on_virtual_time(timer, lambda: waited(manager, handle.operation_id, None, 30.0))
        assert final["status"] == "cancelled"
        assert_valid_polls([first, quiet[0], final])


@pytest.mark.asyncio
async def test_durable_updated_at_does_not_follow_revision_timing() -> None:
    # Devices arriving at 50, 150 and 250 ms cut three revisions; their timing is candidate-derived, so
    # the durable projection's `updated_at` moves only with lifecycle changes (start, end).
    timeline = [(50, strap(0)), (150, strap(1)), (250, strap(2))]
    timer = VirtualTimer()
    async with fast_manager(timer) as manager:
        provider = FaultProvider(timeline, timer=timer)
        profile = with_profile(min_revision_interval_ms=50)
        handle = await start(manager, provider, profile=profile, window_ms=400, timer=timer)
        seen: list[tuple[int, str]] = []
        while (status := await status_of(manager, handle.operation_id))["status"] in ("pending", "running"):
            if "progress" in status:
                updated_at = metadata_of(manager, handle.operation_id)["updated_at"]
                seen.append((status["progress"]["revision"], updated_at))
            await timer.advance(10)
    revisions = {revision for revision, _ in seen}
    assert len(revisions) >= 2
    assert len({updated for _, updated in seen}) == 1


class RecordingJournal:
    """A `DiscoveryJournal` that keeps what it was told."""

    def __init__(self) -> None:
        self.inserted: list[DiscoveryRecord] = []
        self.updates: list[tuple[str, dict[str, Any]]] = []

    async def insert_discovery(self, record: DiscoveryRecord) -> None:
        self.inserted.append(record)

    async def update_discovery(
        self, operation_id: str, metadata: dict[str, Any], *, final_revision: int, ended_at_ms: int | None
    ) -> None:
        self.updates.append((operation_id, metadata))


async def ended(timer: VirtualTimer, session: DiscoverySession, *, after_ms: int) -> None:
    """Move the clock past the window, then on until the session ended and its runner recorded it."""
    await timer.advance(after_ms)
    await timer.run_until(session.finished.is_set)
    await timer.advance(0)  # the runner's bookkeeping after the end (record, claim, schedule)


def _claim(manager: DiscoveryManager, operation_id: str) -> SessionClaim:
    return next(claim for claim in manager.sessions() if claim.operation_id == operation_id)
