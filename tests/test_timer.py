"""The injected timer: the wall one maps to anyio; the virtual one fires sleeps and deadlines in order."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import aiosqlite
import anyio
import pytest

from connector.timer import (
    WALL_TIMER,
    VirtualTimer,
    WallTimer,
    all_tasks_blocked,
    fail_at,
    scope_after,
    sleep_ms,
)

pytestmark = pytest.mark.asyncio


async def test_virtual_sleeps_wake_in_time_order_and_only_when_advanced() -> None:
    timer = VirtualTimer(start_ms=1_000)
    woke: list[tuple[str, int]] = []

    async def sleeper(name: str, at_ms: int) -> None:
        await timer.sleep_until(at_ms)
        woke.append((name, timer.now_ms()))

    async with anyio.create_task_group() as tg:
        tg.start_soon(sleeper, "late", 5_000)
        tg.start_soon(sleeper, "early", 2_000)
        await timer.advance(500)
        assert woke == []
        await timer.advance(4_000)
    assert woke == [("early", 2_000), ("late", 5_000)]
    assert timer.now_ms() == 5_500


async def test_a_virtual_deadline_cancels_its_scope_when_the_clock_reaches_it() -> None:
    timer = VirtualTimer(start_ms=0)
    outcome: list[str] = []

    async def bounded() -> None:
        try:
            with fail_at(timer, 30_000):
                await anyio.sleep_forever()
        except TimeoutError:
            outcome.append(f"timed out at {timer.now_ms()}")

    async with anyio.create_task_group() as tg:
        tg.start_soon(bounded)
        await timer.advance(29_999)
        assert outcome == []
        await timer.advance(1)
    assert outcome == ["timed out at 30000"]


async def test_run_until_jumps_from_due_moment_to_due_moment() -> None:
    timer = VirtualTimer(start_ms=0)
    ticks: list[int] = []

    async def ticker() -> None:
        for _ in range(3):
            await sleep_ms(timer, 10_000)
            ticks.append(timer.now_ms())

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await timer.run_until(lambda: len(ticks) == 3)
    assert ticks == [10_000, 20_000, 30_000]


async def test_run_until_refuses_to_wait_past_its_limit() -> None:
    timer = VirtualTimer(start_ms=0)
    with pytest.raises(AssertionError, match="not done within 1000 ms"):
        await timer.run_until(lambda: False, limit_ms=1_000)


async def test_a_past_deadline_is_cancelled_at_once() -> None:
    timer = VirtualTimer(start_ms=10)
    with timer.scope_until(5) as scope:
        await anyio.sleep_forever()
    assert scope.cancelled_caught


async def test_the_wall_timer_maps_a_moment_onto_the_loop_deadline() -> None:
    now_ms = WALL_TIMER.now_ms()
    scope = WALL_TIMER.scope_until(now_ms + 60_000)
    assert 59 <= scope.deadline - anyio.current_time() <= 60
    assert scope_after(WALL_TIMER, float("inf")).deadline == float("inf")
    with WALL_TIMER.scope_until(now_ms - 1) as past:
        await anyio.sleep_forever()
    assert past.cancelled_caught


async def test_a_wall_timer_on_a_shifted_clock_measures_its_waits_from_that_clock() -> None:
    shifted = WallTimer(lambda: 1_000_000)
    assert shifted.now_ms() == 1_000_000
    scope = shifted.scope_until(1_060_000)
    assert 59 <= scope.deadline - anyio.current_time() <= 60
    with shifted.scope_until(999_999) as past:
        await anyio.sleep_forever()
    assert past.cancelled_caught


async def test_an_advance_waits_for_woken_tasks_by_yielding_never_by_sleeping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # anyio's own wait_all_tasks_blocked sleeps 100 ms of real time whenever a task is runnable.
    timer = VirtualTimer(start_ms=0)
    real_sleep = asyncio.sleep
    slept: list[float] = []

    async def recording_sleep(delay: float) -> None:  # real peer: a spy on asyncio's own sleep
        slept.append(delay)
        await real_sleep(delay)  # real peer: asyncio's own sleep, passed through by the spy

    seen: list[int] = []

    async def ticker() -> None:
        for _ in range(50):
            await timer.sleep_until(timer.now_ms() + 10)
            seen.append(timer.now_ms())
            await real_sleep(0)  # real peer: one loop turn, runnable when the clock looks; the advance waits

    async with anyio.create_task_group() as tg:
        tg.start_soon(ticker)
        await all_tasks_blocked()
        monkeypatch.setattr(asyncio, "sleep", recording_sleep)
        await timer.advance(500)
        monkeypatch.undo()
    assert seen == list(range(10, 510, 10))
    assert slept and set(slept) == {0}


async def _write_then_wait(
    timer: VirtualTimer, database: Path, gate: threading.Event, log: list[int]
) -> None:
    """An aiosqlite statement that waits on `gate` in the connection's thread, then a 10 ms virtual sleep."""
    async with aiosqlite.connect(database) as connection:
        await connection.create_function("wait_for_gate", 0, gate.wait)
        await connection.execute("SELECT wait_for_gate()")
        log.append(timer.now_ms())
    await timer.sleep_until(timer.now_ms() + 10)


async def test_an_advance_waits_for_a_task_whose_statement_is_on_aiosqlite_s_thread(tmp_path: Path) -> None:
    # Real threads are the peer here: the statement's thread answers when the gate opens, however late.
    timer = VirtualTimer(start_ms=0)
    gate = threading.Event()
    log: list[int] = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(_write_then_wait, timer, tmp_path / "t.sqlite", gate, log)
        releaser = threading.Timer(0.05, gate.set)  # real peer: another thread opens the gate
        releaser.start()
        await timer.advance(0)
        assert log == [0] and timer.next_due_ms() == 10  # the sleep after the write is already scheduled
        await timer.advance(10)
    releaser.join()


async def test_an_advance_waits_for_a_thread_offload() -> None:
    timer = VirtualTimer(start_ms=0)
    gate = threading.Event()
    log: list[str] = []

    async def offload_then_wait() -> None:
        await anyio.to_thread.run_sync(gate.wait)
        log.append("back")
        await timer.sleep_until(5)
        log.append("woke")

    async with anyio.create_task_group() as tg:
        tg.start_soon(offload_then_wait)
        releaser = threading.Timer(0.05, gate.set)  # real peer: another thread opens the gate
        releaser.start()
        await timer.advance(5)
        assert log == ["back", "woke"]
    releaser.join()
