"""Bounded waits: poll a condition until it holds, never sleep for a fixed time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

T = TypeVar("T")


async def wait_until(
    predicate: Callable[[], object], *, timeout: float = 10.0, interval: float = 0.01
) -> None:
    """Poll `predicate()` until it is truthy; `TimeoutError` after `timeout` seconds."""
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(interval)  # real peer: a poll's interval; the condition ends it


async def poll(
    fetch: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    *,
    timeout: float = 15.0,
    interval: float = 0.05,
) -> list[T]:
    """Await `fetch()` until `done(answer)`; every answer in order (the last one is done)."""
    seen: list[T] = []
    with anyio.fail_after(timeout):
        while True:
            seen.append(await fetch())
            if done(seen[-1]):
                return seen
            await anyio.sleep(interval)  # real peer: a poll's interval; the condition ends it
