"""The read-only registry view behind `op.get`, and its fallback to the registry's own async API."""

from __future__ import annotations

import sqlite3
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from connector.bus.adapter import BusAdapter, BusSettings
from connector.storage.registry import DeferredRegistry
from connector.storage.registry_reader import RegistryReader
from tests.bus.broker import NatsServer
from tests.bus.support import ble_scan, client, make_env, running_connector
from tests.bus.test_messages import NOW, OP_ID, record
from tests.support.directives import command_directive


@pytest.mark.asyncio
async def test_reader_sees_what_the_registry_commits(tmp_path: Path) -> None:
    async with await DeferredRegistry.open(tmp_path) as registry:
        reader = RegistryReader.open(registry.path)
        assert reader is not None
        try:
            assert reader.find("alice", "job-1") is None and reader.stamp("alice", "job-1") is None
            await registry.record_accepted(record(bus_op="job-1"))
            by_handle, by_id = reader.find("alice", "job-1"), reader.find("bob", OP_ID)
            stored = await registry.get(OP_ID)
            assert by_handle is not None and by_id == by_handle and stored is not None
            for name in ("operation_id", "capability_id", "owner", "status", "bus_op", "metadata"):
                assert getattr(by_handle, name) == getattr(stored, name), name
            assert by_handle.created_at == stored.created_at and by_handle.expires_at == stored.expires_at
            assert reader.find("bob", "job-1") is None  # handles are per owner
            first = reader.stamp("alice", "job-1")
            await registry.record_status(
                OP_ID,
                status="completed",
                metadata={"status": "completed", "reason": "window-complete"},
                now=NOW + timedelta(seconds=2),
                retry_after_seconds=None,
                next_poll_at=None,
            )
            second = reader.stamp("alice", "job-1")
            assert first is not None and second is not None and first[0] == second[0] == OP_ID
            assert second[1] > first[1]
            done = reader.fetch(OP_ID)
            assert done is not None and done.terminal and done.metadata["reason"] == "window-complete"
        finally:
            reader.close()


def test_reader_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    assert RegistryReader.open(tmp_path / "missing.sqlite") is None
    path = tmp_path / "future.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA user_version = 99")
    connection.close()
    assert RegistryReader.open(path) is None


@pytest.mark.asyncio
async def test_reader_never_writes(tmp_path: Path) -> None:
    async with await DeferredRegistry.open(tmp_path) as registry:
        await registry.record_accepted(replace(record(), bus_op="job-1"))
        reader = RegistryReader.open(registry.path)
        assert reader is not None
        try:
            with pytest.raises(sqlite3.OperationalError):
                reader._db.execute("DELETE FROM operations")
        finally:
            reader.close()
        assert await registry.get(OP_ID) is not None


@pytest.mark.asyncio
async def test_fast_and_fallback_answers_are_the_same(tmp_path: Path, broker: NatsServer) -> None:
    env = make_env(tmp_path)
    token = env.tokens["alice"]
    async with running_connector(env, None) as assembled:
        adapter = BusAdapter(
            BusSettings(url=broker.url),
            host=assembled.host,
            registry=assembled.registry,
            data_dir=env.data_dir,
        )
        async with adapter:
            await adapter.subscribed.wait()
            async with client(broker.url, token) as bus:
                await _compare(adapter, bus)


async def _compare(adapter: BusAdapter, bus: Any) -> None:
    """Every answer the same with and without the read-only path."""
    await bus.start(ble_scan(30), op="same-1")
    await bus.start(command_directive("whisper.redaction.prepare", input={"text": "x"}), op="same-2")
    operation_id = (await bus.get("same-1"))["operation/id"]
    assert adapter._reader is not None
    for op in ("same-1", "same-2", operation_id, "nobody"):
        fast = await bus.get(op)
        reader, adapter._reader = adapter._reader, None
        try:
            assert await bus.get(op) == fast, op
        finally:
            adapter._reader = reader
    # A change of the row replaces the remembered answer at once.
    assert (await bus.get("same-1"))["state"] == "running"
    assert (await bus.cancel("same-1"))["cancelled"] is True
    cancelling = await bus.get("same-1")
    assert cancelling["cancellation"]["state"] in ("requested", "confirmed")
    adapter._reader = None  # the fallback serves cancels and gets alone as well
    assert (await bus.get("same-1"))["op"] == "same-1"
    assert (await bus.cancel("same-1"))["cancelled"] is False
