"""Helpers for the runtime tests: scopes, profile, observations, a recording sink, virtual-time awaits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

import anyio

from connector.core.observations import BleObservation, Observation
from connector.core.scope import DiscoveryProfile, DiscoveryScope, ScopeFilter
from connector.errors import ProviderError
from connector.timer import VirtualTimer
from tests.support.directives import HEART_RATE

OTHER_SERVICE = "0000181a-0000-1000-8000-00805f9b34fb"

PROFILE = DiscoveryProfile(
    transports=("ble", "usb-serial", "mdns"),
    max_window_seconds=60,
    max_candidates=64,
    max_snapshot_bytes=65536,
    min_revision_interval_ms=50,
    max_revisions=1000,
    candidate_ttl_seconds=30,
    cleanup_timeout_ms=200,
    result_retention_seconds=600,
)


def ble_scope(**changes: object) -> DiscoveryScope:
    """A heart-rate scope (the usual test scope); keyword arguments replace fields."""
    scope = DiscoveryScope(
        transport="ble",
        window_seconds=1,
        max_candidates=64,
        max_snapshot_bytes=65536,
        filters=ScopeFilter(service_uuids=(HEART_RATE,)),
        cleanup_timeout_ms=PROFILE.cleanup_timeout_ms,
    )
    return replace(scope, **changes)  # type: ignore[arg-type]


def strap(index: int, rssi: int = -60, name: str | None = None) -> BleObservation:
    """An in-scope heart-rate strap with a synthetic address."""
    return BleObservation(
        address=f"02:00:00:00:{index // 256:02X}:{index % 256:02X}",
        rssi=rssi,
        name=name if name is not None else f"strap-{index}",
        service_uuids=(HEART_RATE,),
    )


def stranger(index: int, name: str = "stranger") -> BleObservation:
    """An out-of-scope advertiser (no heart-rate service)."""
    return BleObservation(
        address=f"06:00:00:00:{index // 256:02X}:{index % 256:02X}",
        rssi=-50,
        name=f"{name}-{index}",
        service_uuids=(OTHER_SERVICE,),
        manufacturer_data={0x004C: f"{name}-{index}".encode()},
    )


@dataclass
class RecordingSink:
    """A sink that records what arrived and when (seconds since creation, monotonic or on `timer`)."""

    timer: VirtualTimer | None = None
    started: float = field(init=False)
    observed: list[tuple[float, Observation]] = field(default_factory=list)
    failures: list[ProviderError] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.started = self._now()

    def _now(self) -> float:
        # Milliseconds on a timer (exact), seconds on the monotonic clock.
        return time.monotonic() if self.timer is None else self.timer.now_ms()

    def observe(self, observation: Observation) -> None:
        elapsed = self._now() - self.started
        self.observed.append((elapsed if self.timer is None else elapsed / 1000, observation))

    def fail(self, error: ProviderError) -> None:
        self.failures.append(error)


def other_tasks() -> set[asyncio.Task[object]]:
    """Tasks still alive besides the current one."""
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task() and not task.done()}


_T = TypeVar("_T")


async def on_virtual_time(timer: VirtualTimer, call: Callable[[], Awaitable[_T]]) -> _T:
    """Await `call()` while `timer` jumps from due moment to due moment; its result, or its exception."""
    ended: list[tuple[_T | None, Exception | None]] = []

    async def run() -> None:
        try:
            ended.append((await call(), None))
        except Exception as error:
            ended.append((None, error))

    async with anyio.create_task_group() as task_group:
        task_group.start_soon(run)
        await timer.run_until(lambda: bool(ended))
    result, error = ended[0]
    if error is not None:
        raise error
    return result  # type: ignore[return-value]  # None only when `call` returned None
