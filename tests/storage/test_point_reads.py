"""Point reads of the connector state on a poll's path: an index lookup whatever the number of retained
operations, and never queued behind the writer (its fsyncs, its group commits)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import anyio
import pytest

from connector.storage.state import STATE_RELATIVE_PATH, ConnectorState, DiscoveryRecord

pytestmark = pytest.mark.asyncio


def _record(number: int) -> DiscoveryRecord:
    op_id = f"deferred:sensorium.directive.invoke:{number:026d}"
    metadata = {"operation/id": op_id, "status": "completed", "erased_at": "2026-12-01T00:00:00Z"}
    return DiscoveryRecord(
        op_id, "alice", "device.discovery.scan", "ble", "completed", metadata, {"id": op_id}, ended_at_ms=1
    )


def _retain(data: Path, count: int) -> None:
    """`count` more ended operations, copies of the first row under other ids (one statement)."""
    connection = sqlite3.connect(data / STATE_RELATIVE_PATH)
    with connection:
        connection.execute(
            "INSERT INTO discovery_operations WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
            "FROM n WHERE i < ?) SELECT 'copy-' || i, owner, action_id, transport, status, ended_at_ms, "
            "metadata_json, causal_context_json, final_revision, reply_json FROM discovery_operations, n "
            "LIMIT ?",
            (count, count),
        )
    connection.close()


def _steps(state: ConnectorState, statements: list[str]) -> list[int]:
    """SQLite VM instructions of each read on the reader (a progress handler called every instruction)."""
    reader = state._read_only()
    counts = [0]

    def step() -> int:
        counts[-1] += 1
        return 0

    reader.set_progress_handler(step, 1)
    reader.set_trace_callback(statements.append)
    return counts


async def test_a_poll_reads_by_primary_key_whatever_the_retained_operations(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        await state.insert_discovery(_record(1))
        await state.locate(_record(1).operation_id)  # the reader opened and read the schema once
        costs = []
        for retained in (0, 5000):
            _retain(tmp_path, retained)
            statements: list[str] = []
            counts = _steps(state, statements)
            located = await state.locate(_record(1).operation_id)
            assert located is not None and located.discovery == _record(1)
            assert await state.locate("deferred:sensorium.directive.invoke:unknown") is None
            costs.append(counts[0])
        assert costs[0] == costs[1]  # the same instructions with 1 and 5,001 rows: no scan
        plans = sqlite3.connect(tmp_path / STATE_RELATIVE_PATH)
        for statement in statements:
            details = [row[-1] for row in plans.execute(f"EXPLAIN QUERY PLAN {statement}")]
            searches = [d for d in details if d.startswith(("SEARCH", "SCAN"))]
            assert searches and all(d.startswith("SEARCH") and "(operation_id=?)" in d for d in searches)
        plans.close()


async def test_a_poll_does_not_wait_behind_the_writer(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        await state.insert_discovery(_record(1))
        release = threading.Event()
        await state._db.create_function("hold_writer", 0, lambda: release.wait(30) and 1)
        async with anyio.create_task_group() as group:
            # The writer's thread is busy (as with an fsync, or a group commit), and a write waits behind it.
            group.start_soon(state._db.execute_fetchall, "SELECT hold_writer()")
            group.start_soon(state.insert_discovery, _record(2))
            with anyio.fail_after(10):  # a read queued behind the writer would wait for `release`
                located = await state.locate(_record(1).operation_id)
                fetched = await state.get_discovery(_record(1).operation_id)
            assert located is not None and located.discovery == fetched == _record(1)
            assert await state.locate(_record(2).operation_id) is None  # not committed yet
            release.set()
        assert await state.locate(_record(2).operation_id) is not None
