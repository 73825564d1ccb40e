"""One `Operations` protocol for both kinds: the same questions, None for an id a runtime does not hold."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.core.lifecycle import Status
from connector.runtime.commands import CommandRunner
from connector.runtime.manager import DiscoveryManager
from connector.runtime.operations import Operations
from connector.timer import VirtualTimer
from providers.faults import FaultProvider
from tests.runtime.commands.conftest import program_action, running, wait_for_file
from tests.runtime.sessions import dumps, fast_manager, new_operation_id, start
from tests.runtime.support import on_virtual_time, strap

UNKNOWN = "deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA"
TERMINAL = {"completed", "failed", "timed-out", "cancelled", "expired"}


async def _unknown_everywhere(runtime: Operations[Any, Any]) -> None:
    assert await runtime.status(UNKNOWN) is None
    assert await runtime.status(UNKNOWN, after=3, wait_s=30.0) is None, "no wait for an unknown id"
    assert await runtime.cancel(UNKNOWN) is None
    assert await runtime.observe(UNKNOWN) is None
    await runtime.stop(UNKNOWN, "deadline-exceeded")


@pytest.mark.asyncio
async def test_both_runtimes_are_operations_of_their_own_kind(tmp_path: Path) -> None:
    async with fast_manager() as manager, running(tmp_path) as (_, runner):
        runtimes: list[Operations[Any, Any]] = [manager, runner]
        assert [(runtime.kind, runtime.bindable) for runtime in runtimes] == [
            ("discovery", True),
            ("command", False),
        ]
        for runtime in runtimes:
            await _unknown_everywhere(runtime)


@pytest.mark.asyncio
async def test_a_scan_observed_stopped_and_read_through_the_protocol() -> None:
    timer = VirtualTimer()
    async with fast_manager(timer=timer) as manager:
        runtime: Operations[Any, Any] = manager
        handle = await start(
            manager, FaultProvider([(0, strap(1))], timer=timer), window_ms=5_000, timer=timer
        )
        op_id = handle.operation_id
        observed = await runtime.observe(op_id)
        assert observed is not None and observed.document is None and observed.retry_hint is None
        assert observed.status in ("pending", "running")
        assert "strap-1" not in dumps(dict(observed.metadata))
        await runtime.stop(op_id, "deadline-exceeded")
        # The wait ends at the terminal status, long before its timeout.
        final = await on_virtual_time(timer, lambda: runtime.status(op_id, wait_s=60.0))
        assert final is not None and final["status"] == "failed"
        assert final == await runtime.status(op_id)
        assert timer.now_ms() < handle.session.spec.created_at_ms + 60_000, "the end came before the timeout"
        assert await runtime.cancel(op_id) == (False, final), "terminal: nothing changed"


@pytest.mark.asyncio
async def test_a_scan_cancel_says_whether_it_changed_anything() -> None:
    timer = VirtualTimer()
    async with fast_manager(timer=timer) as manager:
        handle = await start(
            manager, FaultProvider([(0, strap(1))], timer=timer), window_ms=5_000, timer=timer
        )
        first = await manager.cancel(handle.operation_id)
        again = await manager.cancel(handle.operation_id)
        assert first is not None and first[0] is True
        assert again is not None and again[0] is False, "a repeated cancel changes nothing"
        assert first[1]["cancellation"] == again[1]["cancellation"]


@pytest.mark.asyncio
async def test_a_long_poll_that_sees_no_change_returns_at_its_wait_on_the_timer() -> None:
    timer = VirtualTimer()
    async with fast_manager(timer=timer) as manager:
        handle = await start(
            manager, FaultProvider([], timer=timer), window_ms=600_000, expires_in_ms=None, timer=timer
        )
        await timer.run_until(lambda: handle.session.status is Status.RUNNING)  # a visible change ends a wait
        async with _polling(manager, handle.operation_id, wait_s=30.0) as answers:
            await timer.advance(29_999)
            assert answers == [], "still waiting one millisecond before its wait ends"
            await timer.advance(1)
            assert [answer["status"] for answer in answers] == ["running"]


@pytest.mark.asyncio
async def test_a_command_observed_and_stopped_through_the_protocol(tmp_path: Path) -> None:
    action = program_action("sleep", str(tmp_path / "started"), "30")
    async with running(tmp_path) as (_, runner):
        runtime: Operations[Any, Any] = runner
        op_id = new_operation_id()
        await runner.submit(op_id, "alice", action, {}, "async", datetime.now(UTC))
        observed = await runtime.observe(op_id)
        assert observed is not None and observed.document is not None
        assert observed.status in ("pending", "running") and observed.retry_hint == 1
        assert "result" not in observed.metadata
        await wait_for_file(tmp_path / "started")
        await runtime.stop(op_id, "deadline-exceeded")
        final = await runtime.status(op_id)
        assert final is not None and final["status"] == "cancelled"
        assert await runtime.cancel(op_id) == (False, final), "terminal: nothing changed"


@pytest.mark.asyncio
async def test_a_command_cancel_says_it_interrupted_the_work(tmp_path: Path) -> None:
    action = program_action("sleep", str(tmp_path / "started"), "30")
    async with running(tmp_path) as (_, runner):
        op_id = new_operation_id()
        await runner.submit(op_id, "alice", action, {}, "async", datetime.now(UTC))
        await wait_for_file(tmp_path / "started")
        answer = await runner.cancel(op_id)
        assert answer is not None and answer[0] is True and answer[1]["status"] == "cancelled"


@asynccontextmanager
async def _polling(
    manager: DiscoveryManager | CommandRunner, op_id: str, *, wait_s: float
) -> AsyncIterator[list[dict[str, Any]]]:
    """A long poll running in the background; its answer lands in the yielded list."""
    answers: list[dict[str, Any]] = []

    async def poll() -> None:
        answer = await manager.status(op_id, wait_s=wait_s)
        assert answer is not None
        answers.append(answer)

    async with anyio.create_task_group() as group:
        group.start_soon(poll)
        await anyio.wait_all_tasks_blocked()
        yield answers
        group.cancel_scope.cancel()
