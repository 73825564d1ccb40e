"""Connector state: pragmas, migrations, binding and operation round trips, and real erasure of bindings."""

from __future__ import annotations

import contextlib
import sqlite3
import stat
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from connector.errors import SensoriumError
from connector.storage.state import STATE_RELATIVE_PATH, Binding, CommandOperation, ConnectorState

NOW = datetime(2026, 11, 30, 12, 0, 0, 123000, tzinfo=UTC)


def _binding(binding_id: str = "b-1", address: str = "02:00:5E:10:00:01") -> Binding:
    return Binding(binding_id, "alice", "ble", address, NOW)


def _operation(
    op_id: str = "deferred:sensorium.directive.invoke:AAAAAAAAAAAAAAAAAAAAAAAAAA", **kw: object
) -> CommandOperation:
    fields: dict[str, object] = {
        "operation_id": op_id,
        "owner": "alice",
        "action_id": "whisper.redaction.prepare",
        "mode": "async",
        "status": "pending",
        "created_at": NOW,
        "updated_at": NOW,
        "expires_at": NOW + timedelta(minutes=2),
        "cancelable": True,
        "input_json": '{"text":"x"}',
    }
    fields.update(kw)
    return CommandOperation(**fields)  # type: ignore[arg-type]


def _files(data: Path) -> bytes:
    db = data / STATE_RELATIVE_PATH
    return b"".join(p.read_bytes() for p in db.parent.iterdir() if p.name.startswith(db.name))


@pytest.mark.asyncio
async def test_pragmas_and_location(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        assert state.path == tmp_path / "modules" / "sensorium-os" / "state.sqlite"
        assert str(await state.pragma("journal_mode")).lower() == "wal"
        assert await state.pragma("secure_delete") == 1
        assert await state.pragma("synchronous") == 2  # FULL
        assert await state.pragma("user_version") == 2  # bindings + commands, then discovery records
        assert stat.S_IMODE(state.path.stat().st_mode) == 0o600
        with pytest.raises(SensoriumError):
            await state.pragma("user_version; DROP TABLE bindings")


@pytest.mark.asyncio
async def test_reopen_keeps_rows_and_does_not_remigrate(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        await state.insert_binding(_binding())
    async with await ConnectorState.open(tmp_path) as state:
        assert await state.get_binding("b-1") == _binding()
        assert await state.pragma("user_version") == 2


@pytest.mark.asyncio
async def test_binding_round_trip_and_delete(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        await state.insert_binding(_binding())
        assert await state.get_binding("b-1") == _binding()
        assert await state.get_binding("b-2") is None
        with pytest.raises(SensoriumError) as duplicate:
            await state.insert_binding(_binding())
        assert duplicate.value.code == "internal"
        assert await state.delete_binding("b-1") is True
        assert await state.get_binding("b-1") is None
        assert await state.delete_binding("b-1") is False


@pytest.mark.asyncio
async def test_bindings_table_holds_only_the_allowed_columns(tmp_path: Path) -> None:
    async with await ConnectorState.open(tmp_path) as state:
        path = state.path
    with contextlib.closing(sqlite3.connect(path)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(bindings)")]
    assert columns == ["binding_id", "owner", "transport", "address", "bound_at"]


@pytest.mark.asyncio
async def test_forgotten_binding_leaves_no_bytes_behind(tmp_path: Path) -> None:
    canary = "CANARY-ADDR-5f3a9c"
    async with await ConnectorState.open(tmp_path) as state:
        for i in range(50):
            await state.insert_binding(_binding(f"other-{i}", f"02:00:00:00:00:{i:02x}"))
        await state.insert_binding(_binding("b-canary", canary))
        await state.checkpoint()
        assert canary.encode() in _files(tmp_path)  # the check below is meaningful
        await state.insert_binding(_binding("b-wal", canary + "-WAL"))
        assert (canary + "-WAL").encode() in _files(tmp_path)  # still only in the WAL
        assert await state.delete_binding("b-canary")
        assert await state.delete_binding("b-wal")
        assert canary.encode() not in _files(tmp_path)
        await state.checkpoint()
        assert canary.encode() not in _files(tmp_path)
        assert await state.get_binding("other-7") is not None
    assert canary.encode() not in _files(tmp_path)


@pytest.mark.asyncio
async def test_operation_round_trip_update_and_list(tmp_path: Path) -> None:
    first = _operation()
    second = _operation(
        "deferred:sensorium.directive.invoke:BBBBBBBBBBBBBBBBBBBBBBBBBB",
        mode="sync",
        created_at=NOW + timedelta(seconds=1),
        cancelable=False,
        idempotency_fp="ab" * 32,
        causal_context_json='{"operation/id":"x"}',
        input_json=None,
    )
    async with await ConnectorState.open(tmp_path) as state:
        await state.insert_operation(first)
        await state.insert_operation(second)
        assert await state.get_operation(first.operation_id) == first
        assert await state.get_operation(second.operation_id) == second
        with pytest.raises(SensoriumError):
            await state.insert_operation(first)
        done = replace(
            first,
            status="completed",
            updated_at=NOW + timedelta(seconds=3),
            input_json=None,
            result_json='{"ok":true}',
        )
        await state.update_operation(done)
        stored = await state.get_operation(first.operation_id)
        assert stored == done and stored is not None and stored.result == {"ok": True}
        assert [o.operation_id for o in await state.list_operations()] == [
            first.operation_id,
            second.operation_id,
        ]
        assert await state.list_operations(["pending", "running"]) == [second]
        assert await state.list_operations([]) == []
        with pytest.raises(SensoriumError) as unknown:
            await state.update_operation(_operation("deferred:x:CCCCCCCCCCCCCCCCCCCCCCCCCC"))
        assert unknown.value.code == "unknown-operation"


@pytest.mark.asyncio
async def test_delete_operations_before(tmp_path: Path) -> None:
    old = _operation(status="completed", input_json=None)
    young = _operation(
        "deferred:sensorium.directive.invoke:DDDDDDDDDDDDDDDDDDDDDDDDDD",
        status="failed",
        updated_at=NOW + timedelta(days=8),
        input_json=None,
    )
    live = _operation("deferred:sensorium.directive.invoke:EEEEEEEEEEEEEEEEEEEEEEEEEE", status="running")
    async with await ConnectorState.open(tmp_path) as state:
        for op in (old, young, live):
            await state.insert_operation(op)
        cutoff = NOW + timedelta(days=1)
        assert await state.delete_operations_before(["completed", "failed"], cutoff) == 1
        assert await state.delete_operations_before([], cutoff) == 0
        assert [o.operation_id for o in await state.list_operations()] == [
            young.operation_id,
            live.operation_id,
        ]


@pytest.mark.asyncio
async def test_a_restart_counts_interrupted_scans_apart_from_erased_results(tmp_path: Path) -> None:
    from connector.storage.state import DiscoveryRecord

    def record(op_id: str, status: str) -> DiscoveryRecord:
        metadata = {"operation/id": op_id, "status": status, "scope": {"transport": "ble"}}
        return DiscoveryRecord(op_id, "alice", "device.discovery.scan", "ble", status, metadata, {})

    async with await ConnectorState.open(tmp_path) as state:
        await state.insert_discovery(record("op-running", "running"))
        for n in range(5):
            await state.insert_discovery(record(f"op-done-{n}", "completed"))
        await state.insert_discovery(record("op-failed", "failed"))
        assert await state.interrupt_discoveries(1_000, "2026-12-01T00:00:01.000Z") == (1, 5)
        # A second start changes nothing: every record is already concluded.
        assert await state.interrupt_discoveries(2_000, "2026-12-01T00:00:02.000Z") == (0, 0)
        running = await state.get_discovery("op-running")
        assert running is not None and running.metadata["error_code"] == "interrupted-by-restart"
