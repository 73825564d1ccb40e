"""The poller on a fake clock: due polls, jittered cadence, expiry, max attempts, unknown, errors."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import anyio
import pytest
import pytest_asyncio

from connector.core.clock import from_ms, to_ms
from connector.core.policy import DeferredHostPolicy
from connector.host.documents import record_document
from connector.host.poller import Poller
from connector.host.service import HostService
from connector.service.answers import Accepted
from connector.timer import VirtualTimer
from tests.host.fakes import TOKENS, FakePort, Jitter, fake_host
from tests.host.fakes import directive as make_directive
from tests.host.records import T0
from tests.host.support import check
from tests.support.clocks import ManualClock

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[HostService, FakePort, ManualClock]]:
    host, port, clock = await fake_host(tmp_path)
    try:
        yield host, port, clock
    finally:
        await host.registry.aclose()


async def _admit(
    host: HostService, port: FakePort, action: str = "device.discovery.scan", **handle: object
) -> str:
    port.next_handle = dict(handle)
    answer = await host.admit(host.authenticate(TOKENS["alice"]), make_directive(action))
    assert isinstance(answer, Accepted)
    return str(answer.handle["operation/id"])


async def test_only_due_operations_are_polled(setup: tuple[HostService, FakePort, ManualClock]) -> None:
    host, port, _clock = setup
    op_id = await _admit(host, port, "whisper.redaction.prepare", retry_after_seconds=5)
    port.ops[op_id].status = "running"
    port.ops[op_id].retry_hint = 5  # the connector's hint on its status, clamped and jittered (jitter 0)
    assert await host.poll_due(T0 + timedelta(seconds=4)) == 0
    assert await host.poll_due(T0 + timedelta(seconds=5)) == 1
    record = await host.registry.get(op_id)
    assert record is not None and record.status == "running" and record.attempts == 1
    assert record.next_poll_at == T0 + timedelta(seconds=10)
    assert host.metrics.count("sensorium_host_polls") == 1
    assert await host.poll_due(T0 + timedelta(seconds=9)) == 0


async def test_the_cadence_stays_within_the_clamped_hint_and_ten_percent_jitter(tmp_path: Path) -> None:
    rng = random.Random(7)
    host, port, _clock = await fake_host(tmp_path, jitter=Jitter(*[rng.random() for _ in range(500)]))
    try:
        op_id = await _admit(host, port, "test.free", retry_after_seconds=30)
        port.ops[op_id].status = "running"
        port.ops[op_id].retry_hint = 30
        delays = []
        now = T0
        for _ in range(25):
            record = await host.registry.get(op_id)
            assert record is not None and record.next_poll_at is not None
            now = record.next_poll_at
            assert await host.poll_due(now) == 1
            after = await host.registry.get(op_id)
            assert after is not None and after.next_poll_at is not None
            delays.append((after.next_poll_at - now).total_seconds())
        assert all(30 <= d <= 33 for d in delays), delays
        assert len(set(delays)) > 1  # the jitter spreads polls
        port.ops[op_id].retry_hint = 0  # a connector hint below the minimum is clamped up
        record = await host.registry.get(op_id)
        assert record is not None and record.next_poll_at is not None
        await host.poll_due(record.next_poll_at)
        after = await host.registry.get(op_id)
        assert after is not None and after.retry_after_seconds == 1
    finally:
        await host.registry.aclose()


async def test_an_operation_past_expires_at_ends_expired_and_its_work_is_stopped(
    setup: tuple[HostService, FakePort, ManualClock],
) -> None:
    host, port, _clock = setup
    op_id = await _admit(host, port, fail_after_seconds=10)
    port.ops[op_id].status = "running"
    await host.poll_due(T0 + timedelta(seconds=5))
    record = await host.registry.get(op_id)
    assert record is not None and record.next_poll_at is not None
    assert record.next_poll_at <= record.expires_at == T0 + timedelta(seconds=10)
    await host.poll_due(T0 + timedelta(seconds=10))
    expired = await host.registry.get(op_id)
    assert expired is not None and expired.status == "expired" and expired.last_error == "deadline-exceeded"
    assert expired.metadata["error_code"] == "deadline-exceeded"
    assert port.stops == [(op_id, "discovery", "deadline-exceeded")]
    assert host.metrics.count("sensorium_host_expirations") == 1
    assert host.metrics.count("sensorium_host_terminal_outcomes", label="expired") == 1
    check("deferred-operation-status.v2", record_document(expired))
    assert await host.poll_due(T0 + timedelta(hours=1)) == 0  # never polled again


async def test_a_terminal_status_at_the_expiry_poll_wins_over_expiry(
    setup: tuple[HostService, FakePort, ManualClock],
) -> None:
    host, port, _ = setup
    op_id = await _admit(host, port, fail_after_seconds=10)
    port.ops[op_id].status = "completed"
    port.ops[op_id].extra = {
        "reason": "window-complete",
        "cleanup": {"state": "confirmed", "claim": "released"},
    }
    await host.poll_due(T0 + timedelta(seconds=10))
    record = await host.registry.get(op_id)
    assert record is not None and record.status == "completed" and port.stops == []


async def test_max_attempts_polls_without_an_end_expire_the_operation(tmp_path: Path) -> None:
    host, port, _ = await fake_host(tmp_path, policy=DeferredHostPolicy(max_attempts=3))
    try:
        op_id = await _admit(host, port, "whisper.redaction.prepare")
        port.ops[op_id].status = "running"
        now = T0
        for expected in ("running", "running", "expired"):
            now += timedelta(seconds=2)
            await host.poll_due(now)
            record = await host.registry.get(op_id)
            assert record is not None and record.status == expected
        assert record is not None and record.attempts == 3
        assert record.metadata["error"]["code"] == "deadline-exceeded"
        check("deferred-operation-status.v1", record_document(record))
        assert port.stops == [(op_id, "command", "deadline-exceeded")]
    finally:
        await host.registry.aclose()


async def test_a_connector_that_forgot_the_operation_makes_it_unknown_and_terminal(
    setup: tuple[HostService, FakePort, ManualClock],
) -> None:
    host, port, _ = setup
    op_id = await _admit(host, port)
    del port.ops[op_id]
    await host.poll_due(T0 + timedelta(seconds=1))
    record = await host.registry.get(op_id)
    assert record is not None and record.status == "unknown" and record.next_poll_at is None
    assert host.metrics.count("sensorium_host_terminal_outcomes", label="unknown") == 1
    check("deferred-operation-status.v2", record_document(record))
    assert await host.poll_due(T0 + timedelta(days=1)) == 0  # no retry loop on unknown


async def test_a_failing_poll_is_counted_and_rescheduled(
    setup: tuple[HostService, FakePort, ManualClock],
) -> None:
    host, port, _ = setup
    op_id = await _admit(host, port)
    port.failing = RuntimeError("backend detail that must not be logged")
    await host.poll_due(T0 + timedelta(seconds=1))
    record = await host.registry.get(op_id)
    assert record is not None and record.status == "pending" and record.last_error == "internal"
    assert record.attempts == 1 and record.next_poll_at == T0 + timedelta(seconds=2)
    assert host.metrics.count("sensorium_host_poll_errors") == 1
    port.failing = None
    port.ops[op_id].status = "running"
    await host.poll_due(T0 + timedelta(seconds=2))
    record = await host.registry.get(op_id)
    assert record is not None and record.status == "running" and record.attempts == 2


async def test_a_too_large_command_status_ends_failed(
    setup: tuple[HostService, FakePort, ManualClock],
) -> None:
    host, port, _ = setup
    host.policy = DeferredHostPolicy(max_response_bytes=2000)
    op_id = await _admit(host, port, "whisper.redaction.prepare")
    port.ops[op_id].status = "completed"
    port.ops[op_id].document_bytes = 5000
    await host.poll_due(T0 + timedelta(seconds=1))
    record = await host.registry.get(op_id)
    assert record is not None and record.status == "failed" and record.last_error == "response-too-large"
    assert "result" not in record.metadata


async def test_racing_polls_of_one_operation_record_one_end(
    setup: tuple[HostService, FakePort, ManualClock],
) -> None:
    host, port, _ = setup
    op_id = await _admit(host, port)
    port.ops[op_id].status = "failed"
    port.ops[op_id].extra = {"error_code": "provider-failure"}
    stale = await host.registry.get(op_id)
    assert stale is not None
    async with anyio.create_task_group() as group:
        for _ in range(8):
            group.start_soon(host.poll, stale, T0 + timedelta(seconds=1))
    assert host.metrics.count("sensorium_host_terminal_outcomes", label="failed") == 1
    assert [e.status for e in await host.registry.history(op_id)] == ["pending", "failed"]


async def _next_wake(timer: VirtualTimer) -> None:
    """Move the clock to the poller's next wake-up, once it sleeps on the timer again."""
    with anyio.fail_after(5):
        while (due_ms := timer.next_due_ms()) is None:
            await anyio.sleep(0.01)  # real peer: the registry's aiosqlite thread, between two sleeps
    await timer.advance_to(due_ms)


async def test_the_loop_wakes_on_admission_and_polls_when_due(tmp_path: Path) -> None:
    timer = VirtualTimer(start_ms=to_ms(T0))
    host, port, _clock = await fake_host(tmp_path)
    host.clock = lambda: from_ms(timer.now_ms())  # the host reads the timer the poller sleeps on
    try:
        async with Poller(host, timer=timer) as poller:
            op_id = await _admit(host, port, "whisper.redaction.prepare")
            port.ops[op_id].status = "running"
            while (record := await host.registry.get(op_id)) is None or record.attempts == 0:
                await _next_wake(timer)
            assert record.status == "running" and timer.now_ms() - to_ms(T0) <= 2000
            await _next_wake(timer)
            await timer.advance(900_000)  # past expiry: the command's stop runs in the poller's task group
            while port.stops == []:
                await _next_wake(timer)
            assert poller.batch == 1000
        assert host.spawn is None and host.on_admitted is None
        expired = await host.registry.get(op_id)
        assert expired is not None and expired.status == "expired"
    finally:
        await host.registry.aclose()


async def test_the_loop_purges_terminal_metadata_after_retention(tmp_path: Path) -> None:
    host, port, _clock = await fake_host(tmp_path)
    try:
        op_id = await _admit(host, port)
        port.ops[op_id].status = "cancelled"
        port.ops[op_id].extra = {
            "cancellation": {
                "state": "confirmed",
                "requested_at": "2027-01-01T12:00:00Z",
                "confirmed_at": "2027-01-01T12:00:00Z",
            },
            "cleanup": {"state": "confirmed", "claim": "released"},
        }
        poller = Poller(host)
        await poller.tick(T0 + timedelta(seconds=1))
        assert (await host.registry.get(op_id)) is not None
        await poller.tick(T0 + timedelta(days=7, seconds=1))  # exactly 7 days old: kept
        assert (await host.registry.get(op_id)) is not None
        await poller.tick(T0 + timedelta(days=7, seconds=10))
        assert (await host.registry.get(op_id)) is not None  # the purge runs at most once per `purge_every`
        await poller.tick(T0 + timedelta(days=7, hours=2))
        assert await host.registry.get(op_id) is None
        assert host.metrics.count("sensorium_host_operations_active") == 0
    finally:
        await host.registry.aclose()
