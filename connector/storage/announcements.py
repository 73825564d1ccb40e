"""Which operations' `op.done` already went out (`<data-dir>/storage/bus-announcements.sqlite`).

Rules of this file:
- the registry is the outbox (its terminal rows); this store only records which of them were announced,
  so that `op.done` goes out once per operation across reconnects and restarts;
- a row holds an operation id and a time, nothing else: no handle, no metadata, no candidate data;
- a row is written only after the broker acknowledged the announcement (flush), so a crash in between
  announces again rather than never.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from connector.core.clock import format_time
from connector.storage.sqlite import SqliteStore

STORE_RELATIVE_PATH = Path("storage") / "bus-announcements.sqlite"

# Append only: migration N (1-based) moves `user_version` from N-1 to N.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE done_published (
        operation_id TEXT PRIMARY KEY,
        published_at TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX done_published_at ON done_published (published_at);
    """,
)


class AnnouncementStore(SqliteStore):
    """The set of announced operation ids (use `await AnnouncementStore.open(data_dir)` or `async with`)."""

    RELATIVE_PATH = STORE_RELATIVE_PATH
    MIGRATIONS = MIGRATIONS
    WHAT = "announcement store"

    async def is_published(self, operation_id: str) -> bool:
        """True once this operation's `op.done` was acknowledged by the broker."""
        sql = "SELECT 1 FROM done_published WHERE operation_id = ?"
        async with self._db.execute(sql, (operation_id,)) as cursor:
            return await cursor.fetchone() is not None

    async def published(self, operation_ids: list[str]) -> set[str]:
        """The subset of `operation_ids` already announced."""
        found: set[str] = set()
        for start in range(0, len(operation_ids), 500):
            chunk = operation_ids[start : start + 500]
            marks = ",".join("?" * len(chunk))
            sql = f"SELECT operation_id FROM done_published WHERE operation_id IN ({marks})"
            async with self._db.execute(sql, chunk) as cursor:
                found.update(row[0] for row in await cursor.fetchall())
        return found

    async def mark_published(self, operation_id: str, now: datetime) -> None:
        """Record the announcement (idempotent), committed before returning."""
        sql = "INSERT OR IGNORE INTO done_published (operation_id, published_at) VALUES (?, ?)"
        async with self._lock:
            await self._db.execute(sql, (operation_id, format_time(now)))

    async def purge_before(self, cutoff: datetime) -> int:
        """Forget announcements older than `cutoff` (their records are past retention too)."""
        async with self._lock:
            cursor = await self._db.execute(
                "DELETE FROM done_published WHERE published_at < ?", (format_time(cutoff),)
            )
            count = cursor.rowcount
            await cursor.close()
        return count
