"""The durable registry: rows, digest-only history, lifecycle guard, listeners, continuations, kill -9."""

from __future__ import annotations

import json
import sqlite3
import stat
import subprocess
import sys
import textwrap
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import anyio
import pytest

from connector.contract.canonical import sha256_hex
from connector.core.lifecycle import IllegalTransition
from connector.storage.registry import (
    MIGRATIONS,
    REGISTRY_RELATIVE_PATH,
    DeferredRegistry,
    OperationRecord,
    RegistryError,
)
from tests.host.records import T0, discovery_metadata, new_op_id, record
from tests.support.paths import REPO

pytestmark = pytest.mark.asyncio


async def _status(
    registry: DeferredRegistry, op_id: str, status: str, *, seconds: int = 1, **extra: object
) -> OperationRecord:
    now = T0 + timedelta(seconds=seconds)
    return await registry.record_status(
        op_id,
        status=status,
        metadata=discovery_metadata(op_id, status, **extra),
        now=now,
        retry_after_seconds=2,
        next_poll_at=now + timedelta(seconds=2),
    )


async def test_open_creates_a_private_wal_database_with_migrations(tmp_path: Path) -> None:
    async with await DeferredRegistry.open(tmp_path) as registry:
        assert registry.path == tmp_path / REGISTRY_RELATIVE_PATH
        assert await registry.pragma("journal_mode") == "wal"
        assert await registry.pragma("synchronous") == 2  # FULL
        assert await registry.pragma("user_version") == len(MIGRATIONS)
        await registry.record_accepted(record())
    assert stat.S_IMODE(registry.path.stat().st_mode) == 0o600
    async with await DeferredRegistry.open(tmp_path) as again:  # reopening migrates nothing twice
        assert len(await again.list()) == 1


async def test_a_newer_database_is_refused(tmp_path: Path) -> None:
    path = tmp_path / REGISTRY_RELATIVE_PATH
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    with pytest.raises(RegistryError):
        await DeferredRegistry.open(tmp_path)


async def test_accepted_row_round_trips_and_starts_its_history(tmp_path: Path) -> None:
    original = record(correlation_id="corr-1", causal_context={"operation/id": "op:1"}, bus_op="bus-1")
    async with await DeferredRegistry.open(tmp_path) as registry:
        assert await registry.record_accepted(original) is True
        assert await registry.record_accepted(original) is False  # idempotent: known id
        assert await registry.get(original.operation_id) == original
        assert await registry.find_by_bus_op("alice", "bus-1") == original
        assert await registry.find_by_bus_op("bob", "bus-1") is None
        history = await registry.history(original.operation_id)
    assert [(e.seq, e.status, e.at) for e in history] == [(1, "pending", T0)]
    assert history[0].digest == sha256_hex(dict(original.metadata))


async def test_bus_op_is_unique_per_owner(tmp_path: Path) -> None:
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(record(bus_op="same"))
        await registry.record_accepted(record(bus_op="same", owner="bob"))
        with pytest.raises(RegistryError):
            await registry.record_accepted(record(bus_op="same"))


async def test_history_grows_only_when_the_metadata_digest_changes(tmp_path: Path) -> None:
    first = record()
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(first)
        running = await _status(registry, first.operation_id, "running")
        same = await _status(registry, first.operation_id, "running", seconds=2)
        counted = await _status(registry, first.operation_id, "running", seconds=3, disclosed_count=2)
        history = await registry.history(first.operation_id)
    assert running.status == same.status == "running"
    assert same.updated_at == T0 + timedelta(seconds=2) and same.retry_after_seconds == 2
    assert [e.seq for e in history] == [1, 2, 3]
    assert history[-1].digest == sha256_hex(dict(counted.metadata))
    assert history[-1].at == T0 + timedelta(seconds=3)


async def test_attempts_last_error_and_digest_keep_their_value_unless_given(tmp_path: Path) -> None:
    first = record()
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(first)
        op = first.operation_id
        meta = discovery_metadata(op, "running")
        one = await registry.record_status(
            op,
            status="running",
            metadata=meta,
            now=T0,
            retry_after_seconds=1,
            next_poll_at=T0,
            attempts=3,
            last_error="internal",
            diagnostics_digest="d" * 64,
        )
        two = await registry.record_status(
            op, status="running", metadata=meta, now=T0, retry_after_seconds=1, next_poll_at=T0
        )
    assert (one.attempts, one.last_error, one.diagnostics_digest) == (3, "internal", "d" * 64)
    assert (two.attempts, two.last_error, two.diagnostics_digest) == (3, "internal", "d" * 64)


async def test_a_terminal_status_never_changes_and_drops_its_poll_schedule(tmp_path: Path) -> None:
    first = record()
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(first)
        done = await _status(registry, first.operation_id, "completed", reason="window-complete")
        assert (done.retry_after_seconds, done.next_poll_at) == (None, None)
        for status in ("failed", "running", "pending", "unknown"):
            with pytest.raises(IllegalTransition):
                await _status(registry, first.operation_id, status)
        # The same terminal status may refresh its durable metadata (e.g. a late cleanup ack).
        later = await _status(
            registry,
            first.operation_id,
            "completed",
            seconds=5,
            reason="window-complete",
            cleanup={"state": "confirmed", "claim": "released"},
        )
        assert later.metadata["cleanup"]["state"] == "confirmed"
        assert [e.status for e in await registry.history(first.operation_id)] == [
            "pending",
            "completed",
            "completed",
        ]


async def test_running_cannot_go_back_to_pending_but_polls_may_skip_states(tmp_path: Path) -> None:
    a, b = record(), record()
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(a)
        await registry.record_accepted(b)
        await _status(registry, a.operation_id, "running")
        with pytest.raises(IllegalTransition):
            await _status(registry, a.operation_id, "pending")
        assert (await _status(registry, b.operation_id, "completed")).status == "completed"
        with pytest.raises(RegistryError) as unknown:
            await _status(registry, new_op_id(), "running")
    assert unknown.value.code == "unknown-operation"


async def test_terminal_listeners_fire_once_and_can_be_removed(tmp_path: Path) -> None:
    seen: list[str] = []
    also: list[str] = []

    async def async_listener(r: OperationRecord) -> None:
        also.append(r.status)

    def broken(_: OperationRecord) -> None:
        raise RuntimeError("listener bug")

    first, second = record(), record()
    async with await DeferredRegistry.open(tmp_path) as registry:
        registry.add_terminal_listener(broken)  # a broken listener hides nothing from the others
        undo = registry.add_terminal_listener(lambda r: seen.append(r.operation_id))
        registry.add_terminal_listener(async_listener)
        for item in (first, second):
            await registry.record_accepted(item)
        await _status(registry, first.operation_id, "running")
        await _status(registry, first.operation_id, "failed", error_code="provider-failure")
        await _status(registry, first.operation_id, "failed", seconds=4, error_code="provider-failure")
        undo()
        await _status(registry, second.operation_id, "cancelled")
    assert seen == [first.operation_id]
    assert also == ["failed", "cancelled"]


async def test_list_filters_orders_and_limits(tmp_path: Path) -> None:
    rows = [record(now=T0 + timedelta(seconds=i)) for i in range(5)]
    async with await DeferredRegistry.open(tmp_path) as registry:
        for row in rows:
            await registry.record_accepted(row)
        await _status(registry, rows[0].operation_id, "running", seconds=30)
        newest_first = [r.operation_id for r in await registry.list()]
        running = await registry.list(status="running")
        limited = await registry.list(limit=2)
        with pytest.raises(ValueError):
            await registry.list(status="sleeping")
    assert newest_first[0] == rows[0].operation_id
    assert newest_first[1:] == [r.operation_id for r in reversed(rows[1:])]
    assert [r.operation_id for r in running] == [rows[0].operation_id]
    assert len(limited) == 2


async def test_due_answers_non_terminal_rows_whose_poll_time_came(tmp_path: Path) -> None:
    early = record(next_poll_at=T0 + timedelta(seconds=1))
    late = record(next_poll_at=T0 + timedelta(seconds=9))
    gone = record(next_poll_at=T0)
    async with await DeferredRegistry.open(tmp_path) as registry:
        for row in (late, early, gone):
            await registry.record_accepted(row)
        await _status(registry, gone.operation_id, "cancelled")
        assert await registry.due(T0) == []
        assert [r.operation_id for r in await registry.due(T0 + timedelta(seconds=5))] == [early.operation_id]
        both = await registry.due(T0 + timedelta(seconds=9))
        assert [r.operation_id for r in both] == [early.operation_id, late.operation_id]
        assert len(await registry.due(T0 + timedelta(seconds=9), limit=1)) == 1
        assert await registry.next_due_at() == T0 + timedelta(seconds=1)
        assert await registry.count_active() == 2


async def test_mark_interrupted_fails_open_rows_of_the_given_capabilities(tmp_path: Path) -> None:
    scan, done, command = record(), record(), record(kind="command", status="running")
    fired: list[str] = []
    async with await DeferredRegistry.open(tmp_path) as registry:
        registry.add_terminal_listener(lambda r: fired.append(r.operation_id))
        for row in (scan, done, command):
            await registry.record_accepted(row)
        await _status(registry, done.operation_id, "completed")
        marked = await registry.mark_interrupted(T0, capability_ids={"device.discovery.scan"})
        after = await registry.get(command.operation_id)
    assert [r.operation_id for r in marked] == [scan.operation_id]
    assert marked[0].status == "failed" and marked[0].last_error == "interrupted-by-restart"
    assert marked[0].metadata["error_code"] == "interrupted-by-restart"
    assert marked[0].next_poll_at is None
    assert after is not None and after.status == "running"
    assert fired == [done.operation_id]  # start-up marking reports through its return value only


async def test_purge_erases_old_terminal_rows_with_history_and_continuation(tmp_path: Path) -> None:
    old, fresh, open_row = record(), record(), record()
    async with await DeferredRegistry.open(tmp_path) as registry:
        for row in (old, fresh, open_row):
            await registry.record_accepted(row)
        await registry.put_continuation(old.operation_id, {"secret": "flow-state"})
        await _status(registry, old.operation_id, "failed", seconds=1)
        await _status(registry, fresh.operation_id, "failed", seconds=100)
        assert await registry.purge_terminal_before(T0 + timedelta(seconds=50)) == 1
        assert await registry.get(old.operation_id) is None
        assert await registry.history(old.operation_id) == []
        assert await registry.claim_resume(old.operation_id) is None
        assert await registry.get(fresh.operation_id) is not None
        assert await registry.get(open_row.operation_id) is not None
    raw = b"".join(p.read_bytes() for p in registry.path.parent.iterdir())
    assert b"flow-state" not in raw


async def test_continuations_are_stored_apart_and_claimed_exactly_once(tmp_path: Path) -> None:
    row = record()
    continuation = {"schema": "orbiplex-continuation.v1", "context": {"k": "v"}}
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(row)
        digest = await registry.put_continuation(row.operation_id, continuation)
        stored = await registry.get(row.operation_id)
        assert stored is not None and stored.continuation_digest == digest == sha256_hex(continuation)
        assert "context" not in json.dumps([dict(r.metadata) for r in await registry.list()])
        assert await registry.unclaimed_continuations() == []  # not terminal yet
        await _status(registry, row.operation_id, "completed")
        assert await registry.unclaimed_continuations() == [row.operation_id]
        assert await registry.claim_resume(row.operation_id) == continuation
        assert await registry.claim_resume(row.operation_id) is None
        assert await registry.unclaimed_continuations() == []
        with pytest.raises(RegistryError):
            await registry.put_continuation(new_op_id(), continuation)


async def test_claims_race_across_two_connections_and_survive_reopen(tmp_path: Path) -> None:
    rows = [record() for _ in range(5)]
    async with await DeferredRegistry.open(tmp_path) as one:
        for row in rows:
            await one.record_accepted(row)
            await one.put_continuation(row.operation_id, {"n": row.operation_id})
    winners: list[str] = []
    async with await DeferredRegistry.open(tmp_path) as one, await DeferredRegistry.open(tmp_path) as two:

        async def claim(registry: DeferredRegistry, op_id: str) -> None:
            if await registry.claim_resume(op_id) is not None:
                winners.append(op_id)

        async with anyio.create_task_group() as group:
            for row in rows[:4]:
                for registry in (one, two, one, two):
                    group.start_soon(claim, registry, row.operation_id)
    assert sorted(winners) == sorted(r.operation_id for r in rows[:4])
    async with await DeferredRegistry.open(tmp_path) as again:
        assert await again.claim_resume(rows[0].operation_id) is None
        assert await again.claim_resume(rows[4].operation_id) == {"n": rows[4].operation_id}


async def test_racing_status_writers_turn_an_operation_terminal_once(tmp_path: Path) -> None:
    row = record()
    fired: list[str] = []
    async with await DeferredRegistry.open(tmp_path) as one:
        await one.record_accepted(row)
    async with await DeferredRegistry.open(tmp_path) as one, await DeferredRegistry.open(tmp_path) as two:
        for registry in (one, two):
            registry.add_terminal_listener(lambda r: fired.append(r.status))

        async def write(registry: DeferredRegistry) -> None:
            await _status(registry, row.operation_id, "completed")

        async with anyio.create_task_group() as group:
            for registry in (one, two, one, two, one):
                group.start_soon(write, registry)
    assert fired == ["completed"]


_KILLER = textwrap.dedent(
    """
    import os, signal, sys, threading, anyio
    from datetime import timedelta
    sys.path.insert(0, {repo!r})
    from pathlib import Path
    from connector.storage.registry import DeferredRegistry
    from tests.host.records import T0, discovery_metadata, record

    async def main():
        registry = await DeferredRegistry.open(Path(sys.argv[1]))
        for i in range(20):
            row = record(now=T0 + timedelta(seconds=i))
            await registry.record_accepted(row)
            await registry.record_status(
                row.operation_id, status="running", metadata=discovery_metadata(row.operation_id),
                now=T0, retry_after_seconds=1, next_poll_at=T0)
            print(row.operation_id, flush=True)
        # Keep writing while the kill lands: whatever was reported must survive, the file must stay sound.
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGKILL)).start()
        while True:
            await registry.record_accepted(record())

    anyio.run(main)
    """
)


@pytest.mark.realtime  # a child process killed with kill -9
async def test_recorded_writes_survive_kill_9(tmp_path: Path) -> None:
    script = tmp_path / "killer.py"
    script.write_text(_KILLER.format(repo=str(REPO)))
    data_dir = tmp_path / "data"
    done = subprocess.run(
        [sys.executable, str(script), str(data_dir)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -9, done.stderr
    reported = done.stdout.split()
    assert len(reported) == 20
    path = data_dir / REGISTRY_RELATIVE_PATH
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    async with await DeferredRegistry.open(data_dir) as registry:
        for op_id in reported:
            found = await registry.get(op_id)
            assert found is not None and found.status == "running"
            assert [e.status for e in await registry.history(op_id)] == ["pending", "running"]
        assert len(await registry.list(limit=100_000)) >= 20
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


async def test_record_fields_are_copied_not_shared(tmp_path: Path) -> None:
    original = record()
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(original)
        first = await registry.get(original.operation_id)
        assert first is not None
        first.metadata["status"] = "tampered"  # type: ignore[index]
        again = await registry.get(original.operation_id)
    assert again is not None and again.metadata["status"] == "pending"
    assert replace(again, metadata=original.metadata) == original


async def test_a_cancelled_caller_never_leaves_a_write_half_done(tmp_path: Path) -> None:
    rows = [record() for _ in range(30)]
    registry = await DeferredRegistry.open(tmp_path)
    try:
        for row in rows:
            await registry.record_accepted(row)
        for n, row in enumerate(rows):
            async with anyio.create_task_group() as group:
                group.start_soon(registry.purge_terminal_before, T0)
                group.start_soon(registry.put_continuation, row.operation_id, {"n": n})
                group.start_soon(_status, registry, row.operation_id, "running")
                for _ in range(n % 6):
                    await anyio.lowlevel.checkpoint()
                group.cancel_scope.cancel()
            assert not registry._db.in_transaction
    finally:
        await registry.aclose()  # a transaction left open would make the checkpoint fail here
    async with await DeferredRegistry.open(tmp_path) as again:
        for row in rows:
            found = await again.get(row.operation_id)
            assert found is not None and found.status in ("pending", "running")
            assert (found.continuation_digest is None) == (await again.claim_resume(row.operation_id) is None)
