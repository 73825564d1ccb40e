"""The write queue reaches the SQLite thread once per commit, whatever the group's size: each trip is a
thread hop and a GIL hand-off on the event loop's path (issue 17)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from connector.storage.state import ConnectorState
from tests.storage.records import WRITERS, discovery_record
from tests.support.commits import CommitGate
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio



def _count_trips(state: ConnectorState) -> list[int]:
    """Counts every job handed to the connection's thread (aiosqlite's `_execute`, which all calls use)."""
    trips = [0]
    real = state._db._execute

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        trips[0] += 1
        return await real(fn, *args, **kwargs)  # type: ignore[no-untyped-call]

    state._db._execute = counted  # type: ignore[method-assign]
    return trips


async def test_a_group_of_eight_is_one_trip_and_a_lone_write_one(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        gate = CommitGate(state)
        trips = _count_trips(state)
        await state.insert_discovery(discovery_record(0))
        assert trips[0] == 1
        gate.hold()
        async with anyio.create_task_group() as group:
            group.start_soon(state.insert_discovery, discovery_record(1))
            await wait_until(lambda: gate.held_commits == 1)
            for number in range(2, WRITERS + 2):
                group.start_soon(state.insert_discovery, discovery_record(number))
            await wait_until(lambda: state.queued_writes == WRITERS)
            gate.release()
        assert [len(ids) for ids in gate.groups] == [1, 1, WRITERS]
        assert trips[0] == 3  # three commits, one trip each
