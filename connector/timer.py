"""Time for the runtime and the providers: one injected `Timer` (now, sleeps, deadlines), wall or virtual.

The runtime never reads the loop's clock or sleeps on it directly: it asks its timer. `WallTimer` is the
production one (epoch milliseconds, anyio's sleeps and cancel scopes). `VirtualTimer` is the test one, in the
spirit of trio's `MockClock` and zeroconf's `now` arguments: time stands still until a test advances it, and
then every sleep and every deadline due on the way fires in order, so that a test of a 45 s window or a 30 s
retention runs in milliseconds and asserts on recorded state.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import heapq
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import PurePath
from typing import Any, Protocol

import anyio


class Timer(Protocol):
    """Now in epoch milliseconds, a sleep until a moment, and a cancel scope that ends at a moment."""

    def now_ms(self) -> int:
        """Now, in milliseconds since the Unix epoch (on this timer's clock)."""

    async def sleep_until(self, at_ms: int) -> None:
        """Return once `at_ms` has come (at once when it already has)."""

    def scope_until(self, at_ms: int | None, *, shield: bool = False) -> anyio.CancelScope:
        """A cancel scope cancelled when `at_ms` comes (never when None)."""


class WallTimer:
    """The wall clock, with anyio's sleeps and deadlines (the loop's monotonic clock measures the waits).

    `clock_ms` replaces the system clock as "now" (a shifted clock of an assembly); waits stay real.
    """

    def __init__(self, clock_ms: Callable[[], int] | None = None) -> None:
        self._clock_ms = clock_ms

    def now_ms(self) -> int:
        """Now, from the system clock (or the given one)."""
        return time.time_ns() // 1_000_000 if self._clock_ms is None else self._clock_ms()

    async def sleep_until(self, at_ms: int) -> None:
        """anyio's sleep for the time left."""
        await anyio.sleep(max(0, at_ms - self.now_ms()) / 1000)

    def scope_until(self, at_ms: int | None, *, shield: bool = False) -> anyio.CancelScope:
        """A cancel scope with the loop deadline that `at_ms` maps to."""
        if at_ms is None:
            return anyio.CancelScope(shield=shield)
        left_s = max(0, at_ms - self.now_ms()) / 1000
        return anyio.CancelScope(deadline=anyio.current_time() + left_s, shield=shield)


WALL_TIMER = WallTimer()


async def sleep_ms(timer: Timer, ms: int) -> None:
    """Sleep `ms` milliseconds on `timer`."""
    await timer.sleep_until(timer.now_ms() + ms)


def scope_after(timer: Timer, ms: float, *, shield: bool = False) -> anyio.CancelScope:
    """A cancel scope cancelled `ms` milliseconds from now (never when `ms` is infinite)."""
    if ms == float("inf"):
        return timer.scope_until(None, shield=shield)
    return timer.scope_until(timer.now_ms() + int(ms), shield=shield)


@contextmanager
def fail_at(timer: Timer, at_ms: int | None, *, shield: bool = False) -> Iterator[anyio.CancelScope]:
    """Like `anyio.fail_after`, on `timer`: TimeoutError when `at_ms` came before the body ended."""
    with timer.scope_until(at_ms, shield=shield) as scope:
        yield scope
    if scope.cancelled_caught:
        raise TimeoutError


async def all_tasks_blocked() -> None:
    """Return once every other task waits on something: `anyio.wait_all_tasks_blocked`, without its stall.

    anyio's asyncio version sleeps 100 ms of real time whenever a task is still runnable, which a virtual
    step wakes on every advance; this one yields to the loop until they ran. "Blocked" must hold for a few
    loop passes in a row: a task's wake-up can be a chain of callbacks (a finished task's done callback
    completes the future another task waits on), during which it still looks blocked.
    """
    try:
        this = asyncio.current_task()
    except RuntimeError:  # not on asyncio (trio): its own version is exact
        this = None
    if this is None:
        await anyio.wait_all_tasks_blocked()
        return
    await anyio.lowlevel.checkpoint()
    passes = 0
    while passes < _BLOCKED_PASSES:
        others = [task for task in asyncio.all_tasks() if task is not this]
        in_thread = any(_waits_on_thread(task) for task in others)
        blocked = not in_thread and all(_blocked(task) for task in others)
        passes = passes + 1 if blocked else 0
        # A worker thread is real time: yield the core to it rather than spin on the loop.
        await asyncio.sleep(_THREAD_YIELD_S if in_thread else 0)


_BLOCKED_PASSES = 3
_THREAD_YIELD_S = 0.0005
# Coroutines that wait for a worker thread's answer: any of aiosqlite's (each awaits its connection thread),
# and anyio's and asyncio's thread offloads. Such a task is busy, not blocked, until the thread answers.
_THREAD_HOPS = frozenset(
    {("aiosqlite", "*"), ("anyio", "run_sync_in_worker_thread"), ("asyncio", "to_thread")}
)


def _blocked(task: asyncio.Task[object]) -> bool:
    waiter = task._fut_waiter  # type: ignore[attr-defined]  # what anyio reads too
    return waiter is not None and not waiter.done()


def _waits_on_thread(task: asyncio.Task[object]) -> bool:
    """True when a coroutine the task awaits hands work to a worker thread."""
    coroutine: Any = task.get_coro()
    while coroutine is not None:
        code = getattr(coroutine, "cr_code", None) or getattr(coroutine, "gi_code", None)
        if code is not None and _is_thread_hop(code.co_filename, code.co_name):
            return True
        coroutine = _awaited_by(coroutine)
    return False


def _awaited_by(coroutine: Any) -> Any:
    """What a coroutine awaits; through an awaitable object's `__await__` wrapper to its coroutine."""
    awaited = getattr(coroutine, "cr_await", None) or getattr(coroutine, "gi_yieldfrom", None)
    if type(awaited).__name__ == "coroutine_wrapper":  # no attribute names what it wraps: the GC knows
        return next(iter(gc.get_referents(awaited)), None)
    return awaited


@functools.cache  # one answer per code location: the walk runs for every task on every loop pass
def _is_thread_hop(filename: str, function: str) -> bool:
    folders = PurePath(filename).parts
    return any(package in folders and name in ("*", function) for package, name in _THREAD_HOPS)


class VirtualTimer:
    """A clock that moves only when a test advances it; sleeps and deadlines fire in time order on the way.

    Time moves on only after every other task is blocked (`all_tasks_blocked`), so each step sees
    the effects of the one before. A task that waits on a worker thread (an aiosqlite statement, a thread
    offload) is not blocked: time waits for the thread's answer, unlike trio's `MockClock` autojump.
    """

    def __init__(self, start_ms: int = 1_800_000_000_000) -> None:
        self._now_ms = start_ms
        self._order = itertools.count()
        self._due: list[tuple[int, int, Callable[[], None]]] = []

    def now_ms(self) -> int:
        """The virtual now."""
        return self._now_ms

    def __call__(self) -> int:
        """The virtual now (so that the timer also serves where a `Callable[[], int]` clock is taken)."""
        return self._now_ms

    async def sleep_until(self, at_ms: int) -> None:
        """Wait until the clock is advanced to `at_ms`."""
        if at_ms <= self._now_ms:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        self._at(at_ms, woken.set)
        await woken.wait()

    def scope_until(self, at_ms: int | None, *, shield: bool = False) -> anyio.CancelScope:
        """A cancel scope the clock cancels when it reaches `at_ms`."""
        scope = anyio.CancelScope(shield=shield)
        if at_ms is not None:
            if at_ms <= self._now_ms:
                scope.cancel()
            else:
                self._at(at_ms, scope.cancel)
        return scope

    def next_due_ms(self) -> int | None:
        """When the earliest pending sleep or deadline falls due (None when nothing waits on the clock)."""
        return self._due[0][0] if self._due else None

    async def advance(self, ms: int) -> None:
        """Move the clock `ms` forward, firing what falls due on the way, each once the loop is idle."""
        target_ms = self._now_ms + ms
        await all_tasks_blocked()
        while self._due and self._due[0][0] <= target_ms:
            at_ms, _, fire = heapq.heappop(self._due)
            self._now_ms = max(self._now_ms, at_ms)
            fire()
            await all_tasks_blocked()
        self._now_ms = target_ms
        await all_tasks_blocked()

    async def advance_to(self, at_ms: int) -> None:
        """Move the clock to `at_ms` (no-op when it is already past)."""
        await self.advance(max(0, at_ms - self._now_ms))

    async def run_until(self, done: Callable[[], bool], *, limit_ms: int = 3_600_000) -> None:
        """Jump from due moment to due moment until `done()` holds; AssertionError past `limit_ms`."""
        deadline_ms = self._now_ms + limit_ms
        await all_tasks_blocked()
        while not done():
            due_ms = self.next_due_ms()
            if due_ms is None or due_ms > deadline_ms:
                raise AssertionError(f"not done within {limit_ms} ms of virtual time (next due {due_ms})")
            await self.advance_to(due_ms)

    def _at(self, at_ms: int, fire: Callable[[], None]) -> None:
        heapq.heappush(self._due, (at_ms, next(self._order), fire))
