"""Issue D3: workers are shared fairly between principals; a sync call's queue wait counts against its
`timeout_ms`, and one still queued at its timeout ends `failed` `deadline-exceeded`."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import pytest

from connector.runtime.commands import FairSlots
from tests.runtime.commands.conftest import program_action, running, wait_for_file, wait_terminal

OP = "deferred:sensorium.directive.invoke:"


def op_id(n: int) -> str:
    """A well-formed operation id (26 base32 characters) numbered n."""
    return OP + base64.b32encode(n.to_bytes(16, "big")).decode().rstrip("=")


@pytest.mark.asyncio
async def test_a_freed_worker_goes_to_the_waiting_principal_not_to_the_hog() -> None:
    slots = FairSlots(2)
    await slots.acquire("hog")
    await slots.acquire("hog")  # nobody waits: a principal may use every worker
    order: list[str] = []

    async def take(owner: str) -> None:
        await slots.acquire(owner)
        order.append(owner)

    async with anyio.create_task_group() as group:
        for owner in ("hog", "hog", "victim", "hog"):
            group.start_soon(take, owner)
            await anyio.sleep(0.01)
        slots.release("hog")
        await anyio.sleep(0.01)
        assert order == ["victim"]  # the hog is at half the workers while another principal waits
        slots.release("hog")
        await anyio.sleep(0.01)
        assert order == ["victim", "hog"]
        slots.release("victim")
        await anyio.sleep(0.01)
        slots.release("hog")
        await anyio.sleep(0.01)
        assert order == ["victim", "hog", "hog", "hog"]  # nobody else waits: the hog gets both again
        assert slots.busy("hog") == 2


@pytest.mark.asyncio
async def test_a_cancelled_waiter_gives_its_turn_away() -> None:
    slots = FairSlots(1)
    await slots.acquire("a")
    got: list[str] = []
    scope = anyio.CancelScope()

    async def take(owner: str) -> None:
        await slots.acquire(owner)
        got.append(owner)

    async def cancelled_take() -> None:
        with scope:
            await slots.acquire("c")

    async with anyio.create_task_group() as group:
        group.start_soon(cancelled_take)
        await anyio.sleep(0.01)
        group.start_soon(take, "b")
        await anyio.sleep(0.01)
        scope.cancel()
        await anyio.sleep(0.01)
        slots.release("a")
        await anyio.sleep(0.01)
        assert got == ["b"] and slots.busy("c") == 0 and slots.busy("b") == 1
        slots.release("b")


@pytest.mark.asyncio
async def test_a_sync_call_still_queued_at_its_timeout_is_deadline_exceeded(tmp_path: Path) -> None:
    """Both workers are held by another principal's long work: the victim answers at its timeout."""
    async with running(tmp_path, max_workers=2) as (_, runner):
        for n in (1, 2):
            long = program_action("sleep", str(tmp_path / f"m{n}"), "30", execution_mode_support="either")
            await runner.submit(op_id(n), "hog", long, {}, "async", datetime.now(UTC))
        for n in (1, 2):  # each hog run wrote its marker: both workers are held before the victim queues
            await wait_for_file(tmp_path / f"m{n}")
        quick = program_action("nan", execution_mode_support="either")
        started = time.monotonic()
        with anyio.fail_after(10):
            answer = await runner.submit(
                op_id(3), "victim", quick, {}, "sync", datetime.now(UTC), timeout_ms=1000
            )
        waited = time.monotonic() - started
        assert answer["status"] == "failed" and answer["error"]["code"] == "deadline-exceeded"
        assert 0.9 <= waited < 10  # bounded by its own timeout, not by the hog's 30 s work
        status = await wait_terminal(runner, op_id(3))
        assert (status["status"], status["error"]["code"]) == ("failed", "deadline-exceeded")
        for n in (1, 2):
            await runner.cancel(op_id(n))


@pytest.mark.asyncio
async def test_the_queue_wait_counts_against_a_sync_budget(tmp_path: Path) -> None:
    """A sync call that got a worker late has only what is left of its `timeout_ms` to run."""
    async with running(tmp_path, max_workers=1) as (_, runner):
        blocker = program_action("sleep", str(tmp_path / "b"), "3", execution_mode_support="either")
        await runner.submit(op_id(4), "other", blocker, {}, "async", datetime.now(UTC))
        await wait_for_file(tmp_path / "b")
        slow = program_action("sleep", str(tmp_path / "s"), "2", execution_mode_support="either")
        with anyio.fail_after(15):
            answer = await runner.submit(
                op_id(5), "victim", slow, {}, "sync", datetime.now(UTC), timeout_ms=4000
            )
        # Alone it would finish (2 s < 4 s); queued behind the 3 s blocker it has < 2 s left, however late
        # this call reached the queue (up to 1 s after the blocker's marker).
        assert answer["status"] == "failed" and answer["error"]["code"] == "deadline-exceeded"
