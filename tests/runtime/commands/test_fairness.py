"""Issue D3: workers are shared fairly between principals; a sync call's queue wait counts against its
`timeout_ms`, and one still queued at its timeout ends `failed` `deadline-exceeded`."""

from __future__ import annotations

import base64
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.runtime.commands import FairSlots
from connector.timer import VirtualTimer
from tests.runtime.commands.conftest import (
    answered,
    program_action,
    running,
    status_of,
    sync_call,
    virtual_now,
    wait_for_file,
    wait_terminal,
)

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
            await anyio.wait_all_tasks_blocked()
        slots.release("hog")
        await anyio.wait_all_tasks_blocked()
        assert order == ["victim"]  # the hog is at half the workers while another principal waits
        slots.release("hog")
        await anyio.wait_all_tasks_blocked()
        assert order == ["victim", "hog"]
        slots.release("victim")
        await anyio.wait_all_tasks_blocked()
        slots.release("hog")
        await anyio.wait_all_tasks_blocked()
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
        await anyio.wait_all_tasks_blocked()
        group.start_soon(take, "b")
        await anyio.wait_all_tasks_blocked()
        scope.cancel()
        await anyio.wait_all_tasks_blocked()
        slots.release("a")
        await anyio.wait_all_tasks_blocked()
        assert got == ["b"] and slots.busy("c") == 0 and slots.busy("b") == 1
        slots.release("b")


@pytest.mark.asyncio
@pytest.mark.realtime  # the hog's programs are real processes; every deadline is on the virtual timer
async def test_a_sync_call_still_queued_at_its_timeout_is_deadline_exceeded(tmp_path: Path) -> None:
    """Both workers are held by another principal's long work: the victim answers at its timeout."""
    timer = VirtualTimer()
    async with running(tmp_path, max_workers=2, timer=timer) as (_, runner), anyio.create_task_group() as tg:
        for n in (1, 2):
            long = program_action("sleep", str(tmp_path / f"m{n}"), "30", execution_mode_support="either")
            await runner.submit(op_id(n), "hog", long, {}, "async", virtual_now(timer))
        for n in (1, 2):  # each hog run wrote its marker: both workers are held before the victim queues
            await wait_for_file(tmp_path / f"m{n}")
        quick = program_action("nan", execution_mode_support="either")
        answers: list[dict[str, Any]] = []
        tg.start_soon(
            partial(sync_call, runner, answers, op_id(3), quick, virtual_now(timer), timeout_ms=1000)
        )
        await timer.advance(999)
        queued = await status_of(runner, op_id(3))
        assert answers == [] and queued["status"] == "pending", "still queued, within its budget"
        await timer.advance(1)
        answer = await answered(answers)  # its end is written through the state's thread
        assert (answer["status"], answer["error"]["code"]) == ("failed", "deadline-exceeded")
        status = await wait_terminal(runner, op_id(3))
        assert (status["status"], status["error"]["code"]) == ("failed", "deadline-exceeded")
        assert [(await status_of(runner, op_id(n)))["status"] for n in (1, 2)] == ["running", "running"]
        for n in (1, 2):
            await runner.cancel(op_id(n))


@pytest.mark.asyncio
@pytest.mark.realtime  # real processes; the budget and the queue wait are measured on the virtual timer
async def test_the_queue_wait_counts_against_a_sync_budget(tmp_path: Path) -> None:
    """A sync call that got a worker late has only what is left of its `timeout_ms` to run."""
    timer = VirtualTimer()
    async with running(tmp_path, max_workers=1, timer=timer) as (_, runner), anyio.create_task_group() as tg:
        blocker = program_action("sleep", str(tmp_path / "b"), "30", execution_mode_support="either")
        await runner.submit(op_id(4), "other", blocker, {}, "async", virtual_now(timer))
        await wait_for_file(tmp_path / "b")
        slow = program_action("sleep", str(tmp_path / "s"), "30", execution_mode_support="either")
        answers: list[dict[str, Any]] = []
        tg.start_soon(
            partial(sync_call, runner, answers, op_id(5), slow, virtual_now(timer), timeout_ms=4000)
        )
        await timer.advance(3000)  # three seconds in the queue behind the blocker
        assert (await status_of(runner, op_id(5)))["status"] == "pending"
        await runner.cancel(op_id(4))  # the worker is free: the victim runs with 1 s of its 4 s left
        await wait_for_file(tmp_path / "s")
        await timer.advance(999)
        assert answers == [] and (await status_of(runner, op_id(5)))["status"] == "running"
        await timer.advance(1)
        answer = await answered(answers)  # the real process is terminated and reaped
        assert (answer["status"], answer["error"]["code"]) == ("failed", "deadline-exceeded")
