"""The write queue of the SQLite stores (CONTRACT §7): concurrent writes share one commit, and each writer
returns only once the commit that holds its row is durable; a refused statement refuses only itself."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import anyio
import pytest

from connector.errors import SensoriumError
from connector.storage.state import STATE_RELATIVE_PATH, ConnectorState
from tests.storage.records import WRITERS, discovery_record
from tests.support.commits import CommitGate
from tests.support.waiting import wait_until

pytestmark = pytest.mark.asyncio



def _visible(data: Path) -> set[str]:
    """Operation ids another connection reads: only what was committed."""
    connection = sqlite3.connect(f"file:{data / STATE_RELATIVE_PATH}?mode=ro", uri=True)
    try:
        return {row[0] for row in connection.execute("SELECT operation_id FROM discovery_operations")}
    finally:
        connection.close()


async def test_concurrent_writes_share_a_commit_and_each_returns_after_its_own(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        gate = CommitGate(state)
        gate.hold()
        returned: list[tuple[str, int, set[str]]] = []  # (id, commits done, ids committed) at return

        async def insert(number: int) -> None:
            record = discovery_record(number)
            await state.insert_discovery(record)
            returned.append((record.operation_id, len(gate.groups), _visible(tmp_path)))

        async with anyio.create_task_group() as group:
            group.start_soon(insert, 0)
            await wait_until(lambda: gate.held_commits == 1)  # the first commit is at its fsync
            for number in range(1, WRITERS):
                group.start_soon(insert, number)
            await wait_until(lambda: state.queued_writes == WRITERS - 1)  # the others wait behind it
            assert returned == [] and _visible(tmp_path) == set()
            gate.release()
        groups = gate.groups
        assert [len(ids) for ids in groups] == [1, WRITERS - 1]  # 8 rows, 2 fsyncs
        assert state.commits == 2
        for op_id, commits_done, committed in returned:
            holding = next(index for index, ids in enumerate(groups) if op_id in ids)
            assert commits_done > holding and op_id in committed  # its own commit came first


async def test_a_refused_statement_refuses_only_its_writer(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        await state.insert_discovery(discovery_record(0))
        gate = CommitGate(state)
        gate.hold()
        outcomes: dict[int, str] = {}

        async def insert(number: int) -> None:
            try:
                await state.insert_discovery(discovery_record(number))
                outcomes[number] = "stored"
            except SensoriumError as error:
                outcomes[number] = error.code

        async with anyio.create_task_group() as group:
            group.start_soon(insert, 9)  # its commit is held while the next three queue behind it
            await wait_until(lambda: gate.held_commits == 1)
            for number in (0, 1, 2):  # 0 exists already
                group.start_soon(insert, number)
            await wait_until(lambda: state.queued_writes == 3)
            gate.release()
        assert outcomes == {9: "stored", 0: "internal", 1: "stored", 2: "stored"}
        rest = sorted(discovery_record(n).operation_id for n in (0, 1, 2))
        expected = [[discovery_record(9).operation_id], rest]
        assert [sorted(ids) for ids in gate.groups] == expected
        assert _visible(tmp_path) == {discovery_record(n).operation_id for n in (0, 1, 2, 9)}


async def test_a_failed_commit_fails_each_writer_of_it_and_keeps_none_of_their_rows(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        gate = CommitGate(state)
        gate.hold()
        gate.failing = {2}  # the second commit: the group of three queued behind the first
        outcomes: dict[int, str] = {}

        async def insert(number: int) -> None:
            try:
                await state.insert_discovery(discovery_record(number))
                outcomes[number] = "stored"
            except OSError:
                outcomes[number] = "failed"

        async with anyio.create_task_group() as group:
            group.start_soon(insert, 0)
            await wait_until(lambda: gate.held_commits == 1)
            for number in (1, 2, 3):
                group.start_soon(insert, number)
            await wait_until(lambda: state.queued_writes == 3)
            gate.release()
        assert outcomes == {0: "stored", 1: "failed", 2: "failed", 3: "failed"}
        assert _visible(tmp_path) == {discovery_record(0).operation_id}  # none of the failed group's rows
        await state.insert_discovery(discovery_record(1))  # the queue goes on; the id was never taken
        assert _visible(tmp_path) == {discovery_record(0).operation_id, discovery_record(1).operation_id}
