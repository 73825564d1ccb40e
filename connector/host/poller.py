"""The host's poller: wakes when an operation is due (or a new one was admitted) and polls it.

`async with Poller(host)` runs the loop in its own task group and waits on its `Timer` (the wall one unless
given another); `tick(now)` is one pass and is what tests drive with a fake clock. Every cadence decision
(clamped and jittered retry, expiry, max attempts, unknown as terminal) is `HostService.poll`'s; this file
only decides when to look.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any

import anyio
from anyio.abc import TaskGroup

from connector.host.service import HostService
from connector.timer import WALL_TIMER, Timer, scope_after

_log = logging.getLogger("sensorium.host")


class Poller:
    """Background polling of due operations and the retention purge."""

    def __init__(
        self,
        host: HostService,
        *,
        batch: int = 1000,
        min_sleep_seconds: float = 0.05,
        max_sleep_seconds: float = 1.0,
        purge_every: timedelta = timedelta(hours=1),
        timer: Timer = WALL_TIMER,
    ) -> None:
        self.host = host
        self._timer = timer
        self.batch = batch
        self._min_sleep = min_sleep_seconds
        self._max_sleep = max_sleep_seconds
        self._purge_every = purge_every
        self._next_purge: datetime | None = None
        self._wake = anyio.Event()
        self._task_group: TaskGroup | None = None

    async def __aenter__(self) -> Poller:
        self._task_group = await anyio.create_task_group().__aenter__()
        self.host.spawn = self._spawn
        self.host.on_admitted = self.wake
        self._task_group.start_soon(self.run)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self.host.spawn = None
        self.host.on_admitted = None
        assert self._task_group is not None
        self._task_group.cancel_scope.cancel()
        return await self._task_group.__aexit__(exc_type, exc, tb)

    def wake(self) -> None:
        """Look again now (a new operation was admitted)."""
        self._wake.set()

    def _spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        if self._task_group is not None:
            self._task_group.start_soon(_run, work)

    async def run(self) -> None:
        """Poll, purge, sleep until the next due poll; forever (cancelled by leaving the context)."""
        while True:
            try:
                await self.tick()
            except Exception as error:  # the loop outlives a broken pass; type name only
                self.host.metrics.errors.inc()
                _log.error("poller pass failed with %s", type(error).__name__)
            await self._sleep()

    async def tick(self, now: datetime | None = None) -> int:
        """One pass: every due operation polled once, then the retention purge when it is time."""
        now = now or self.host.clock()
        polled = await self.host.poll_due(now, limit=self.batch)
        if self._next_purge is None or now >= self._next_purge:
            await self.host.purge(now)
            self._next_purge = now + self._purge_every
        return polled

    async def _sleep(self) -> None:
        due = await self.host.registry.next_due_at()
        delay = self._max_sleep
        if due is not None:
            delay = (due - self.host.clock()).total_seconds()
        self._wake = anyio.Event()
        with scope_after(self._timer, min(max(delay, self._min_sleep), self._max_sleep) * 1000):
            await self._wake.wait()


async def _run(work: Callable[[], Awaitable[Any]]) -> None:
    await work()
