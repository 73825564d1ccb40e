"""A read-only, synchronous view of the host registry for hot point reads (the Bus's `op.get`).

Why: `op.get` is a point read by an index. Through aiosqlite every read hops to a worker thread and back,
which costs several times the read itself; in WAL mode a second, read-only connection reads a consistent
snapshot while the host writes, and blocks the event loop only for the read (tens of microseconds).

Rules of this file:
- read-only (`mode=ro`), never a write, never a column the Bus does not need (no continuation, no handle);
- it knows the registry's schema version 1 only: any other version makes `open` answer None, and the
  caller reads through the registry's own async API instead;
- a failing read answers None to the caller's fallback the same way; it never raises a stored value.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from connector.core.lifecycle import Status, is_terminal

KNOWN_SCHEMA_VERSIONS = frozenset({1})
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMNS = (
    "operation_id, operation_kind, capability_id, owner, status, last_error, expires_at, created_at, "
    "updated_at, bus_op, metadata"
)


@dataclass(frozen=True, slots=True)
class ReadRecord:
    """The columns of one registry row a point read answers (a Bus `messages.DurableRecord`)."""

    operation_id: str
    operation_kind: str
    capability_id: str
    owner: str
    status: str
    last_error: str | None
    expires_at: datetime
    created_at: datetime
    updated_at: datetime
    bus_op: str | None
    metadata: Mapping[str, Any]

    @property
    def terminal(self) -> bool:
        """True once the status never changes again."""
        return is_terminal(Status(self.status))


def _time(value: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=value)


def _record(row: tuple[Any, ...]) -> ReadRecord:
    return ReadRecord(
        operation_id=row[0],
        operation_kind=row[1],
        capability_id=row[2],
        owner=row[3],
        status=row[4],
        last_error=row[5],
        expires_at=_time(row[6]),
        created_at=_time(row[7]),
        updated_at=_time(row[8]),
        bus_op=row[9],
        metadata=json.loads(row[10]),
    )


class RegistryReader:
    """Point reads of the registry by Bus handle or operation id (`RegistryReader.open(path)`)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._db = connection

    @classmethod
    def open(cls, path: Path) -> RegistryReader | None:
        """A reader over an existing registry of a known schema version, else None."""
        if not path.is_file():
            return None
        try:
            connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            connection.execute("PRAGMA busy_timeout = 200")
            version = connection.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.Error:
            return None
        if version not in KNOWN_SCHEMA_VERSIONS:
            connection.close()
            return None
        return cls(connection)

    def close(self) -> None:
        """Close the connection."""
        self._db.close()

    def stamp(self, owner: str, op: str) -> tuple[str, int] | None:
        """`(operation_id, version)` of the row `find` would answer; the version grows with every update.

        Raises `sqlite3.Error` when the read fails.
        """
        by_handle = "SELECT operation_id, version FROM operations WHERE owner = ? AND bus_op = ?"
        row = self._db.execute(by_handle, (owner, op)).fetchone()
        if row is None:
            row = self._db.execute(
                "SELECT operation_id, version FROM operations WHERE operation_id = ?", (op,)
            ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def fetch(self, operation_id: str) -> ReadRecord | None:
        """One row by operation id (raises `sqlite3.Error` when the read fails)."""
        row = self._db.execute(
            f"SELECT {_COLUMNS} FROM operations WHERE operation_id = ?", (operation_id,)
        ).fetchone()
        return None if row is None else _record(tuple(row))

    def find(self, owner: str, op: str) -> ReadRecord | None:
        """The row `owner` started under the Bus handle `op`, else the row whose operation id is `op`.

        Raises `sqlite3.Error` when the read fails (the caller falls back to the async registry API).
        """
        by_handle = f"SELECT {_COLUMNS} FROM operations WHERE owner = ? AND bus_op = ?"
        row = self._db.execute(by_handle, (owner, op)).fetchone()
        if row is None:
            by_id = f"SELECT {_COLUMNS} FROM operations WHERE operation_id = ?"
            row = self._db.execute(by_id, (op,)).fetchone()
        return None if row is None else _record(tuple(row))
