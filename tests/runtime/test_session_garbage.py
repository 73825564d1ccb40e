"""An ended session leaves memory by reference counting once the runtime forgets it: no reference cycle
keeps it (or its provider session) for a full garbage collection, which walks every retained session on the
event loop's thread (issue 17: the status poll's p99 with thousands of operations behind it)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

from connector.storage.state import DiscoveryRecord
from connector.timer import VirtualTimer
from providers.replay import ReplayProvider
from tests.runtime.sessions import drive_until, fast_manager, start, with_profile

if TYPE_CHECKING:
    from connector.runtime.manager import DiscoveryManager
    from connector.runtime.session import DiscoverySession
    from providers.base import Provider, ProviderSession

pytestmark = pytest.mark.asyncio


class _Journal:
    """Takes the durable rows as the state store would (the manager then forgets a session at erasure)."""

    async def insert_discovery(self, record: DiscoveryRecord) -> None:
        """Row taken."""

    async def update_discovery(self, operation_id: str, metadata: dict[str, Any], **_: Any) -> None:
        """Row updated."""


class _Ended(NamedTuple):
    operation_id: str
    session: weakref.ref[DiscoverySession]
    provider_session: weakref.ref[ProviderSession]


@pytest.fixture
def no_collection() -> Iterator[None]:
    """Only reference counting frees anything while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _ended_scan(manager: DiscoveryManager, provider: Provider, timer: VirtualTimer) -> _Ended:
    """Run one scan to its end; only weak references to its session and provider session leave here."""
    started = await start(
        manager, provider, profile=with_profile(result_retention_seconds=1), window_ms=300, timer=timer
    )
    await drive_until(timer, lambda: started.session._provider_session is not None)
    assert started.session._provider_session is not None
    provider_session = weakref.ref(started.session._provider_session)
    await drive_until(timer, lambda: started.session.is_terminal)
    return _Ended(started.operation_id, weakref.ref(started.session), provider_session)


async def test_a_forgotten_session_and_its_provider_session_are_freed_at_once(
    fixtures_dir: Path, no_collection: None
) -> None:
    timer = VirtualTimer()
    provider = ReplayProvider(fixtures_dir / "ble-heart-rate-lab.jsonl", speed=1.0, timer=timer)
    async with fast_manager(timer, journal=_Journal()) as manager:
        ended = await _ended_scan(manager, provider, timer)
        await drive_until(timer, lambda: manager.session(ended.operation_id) is None)
        assert ended.session() is None and ended.provider_session() is None
