"""The record of announced operations behind `op.done` exactly once."""

from __future__ import annotations

import os
import sqlite3
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from connector.storage.announcements import STORE_RELATIVE_PATH, AnnouncementStore

NOW = datetime(2027, 1, 1, tzinfo=UTC)


@pytest.mark.asyncio
async def test_announcements_survive_a_reopen_and_expire_with_retention(tmp_path: Path) -> None:
    ids = [f"deferred:sensorium.directive.invoke:{n:026d}" for n in range(1200)]
    async with await AnnouncementStore.open(tmp_path) as store:
        assert not await store.is_published(ids[0])
        await store.mark_published(ids[0], NOW - timedelta(days=9))
        await store.mark_published(ids[0], NOW)  # idempotent: the first time stays
        for op_id in ids[1:700]:
            await store.mark_published(op_id, NOW)
    path = tmp_path / STORE_RELATIVE_PATH
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    async with await AnnouncementStore.open(tmp_path) as store:
        assert await store.published(ids) == set(ids[:700])  # more ids than one IN list holds
        assert await store.purge_before(NOW - timedelta(days=8)) == 1
        assert not await store.is_published(ids[0]) and await store.is_published(ids[1])
    # An operation id and a time per row, nothing else (no handle, no metadata).
    with sqlite3.connect(path) as connection:
        columns = [row[1] for row in connection.execute("PRAGMA table_info(done_published)")]
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    connection.close()
    assert columns == ["operation_id", "published_at"] and tables == ["done_published"]
