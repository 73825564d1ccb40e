"""One way to open this project's SQLite files: private mode, WAL, full fsync, secure delete, migrations.

`SqliteStore` is the base of the three stores (connector state, host registry, Bus announcements): one
connection, one write lock, opened, checkpointed and closed the same way. Its write queue (`_commit`) is a
group commit: statements that wait for the same fsync are committed in one transaction, and each caller
returns only once the transaction holding its statement is durable (CONTRACT §7); a group reaches the
connection's thread in one round trip (`_run_transaction`), whatever its size. Point reads on
hot paths (`_read`) go through a second, read-only connection on the event loop's own thread: in WAL mode
it reads the last committed snapshot without waiting behind the writer's queue or its fsyncs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

import aiosqlite
import anyio

from connector.errors import Code, SensoriumError
from connector.storage.files import make_private_dir

# aiosqlite logs SQL parameters (binding addresses among them) at DEBUG: never below INFO here.
logging.getLogger("aiosqlite").setLevel(logging.INFO)
_log = logging.getLogger("sensorium.storage")

PRAGMAS = ("synchronous=FULL", "secure_delete=ON", "foreign_keys=ON", "busy_timeout=5000")


async def open_database(
    path: Path, migrations: Sequence[str], *, what: str, error: type[SensoriumError] = SensoriumError
) -> aiosqlite.Connection:
    """Create (0600) or open `path`, configure it and apply the migrations past its `user_version`."""
    make_private_dir(path.parent)
    # SQLite gives the -wal and -shm files the mode of the database file, so 0600 covers all three.
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))
    connection = await aiosqlite.connect(path, isolation_level=None)
    try:
        await _configure(connection, what, error)
        await _migrate(connection, migrations, what, error)
    except BaseException:
        await connection.close()
        raise
    return connection


async def _configure(connection: aiosqlite.Connection, what: str, error: type[SensoriumError]) -> None:
    """WAL, full fsync on every commit, secure delete (deleted rows are zeroed)."""
    rows = await connection.execute_fetchall("PRAGMA journal_mode=WAL")
    mode = next(iter(rows), ("",))[0]
    if str(mode).lower() != "wal":
        raise error(f"{what} refused WAL mode", code=Code.INTERNAL)
    for pragma in PRAGMAS:
        await connection.execute(f"PRAGMA {pragma}")


async def _migrate(
    connection: aiosqlite.Connection, migrations: Sequence[str], what: str, error: type[SensoriumError]
) -> None:
    """Apply every migration past the stored `user_version`, each in its own transaction."""
    rows = await connection.execute_fetchall("PRAGMA user_version")
    version = int(next(iter(rows), (0,))[0] or 0)
    if version > len(migrations):
        raise error(f"{what} is newer than this program", code=Code.INTERNAL)
    for number, script in enumerate(migrations[version:], start=version + 1):
        await connection.executescript(
            f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;"
        )


@dataclass(slots=True)
class _QueuedWrite:
    """One write statement waiting for the commit that will hold it."""

    sql: str
    params: tuple[Any, ...]
    done: bool = False
    rowcount: int = 0
    error: BaseException | None = None


def _commit_group(connection: sqlite3.Connection, batch: Sequence[_QueuedWrite]) -> None:
    """On the connection's thread: the batch as one transaction (a lone statement is its own commit); a
    constraint a statement breaks refuses it alone (SQLite undoes that statement only)."""
    grouped = len(batch) > 1
    if grouped:
        connection.execute("BEGIN IMMEDIATE")
    for write in batch:
        try:
            write.rowcount = connection.execute(write.sql, write.params).rowcount
        except sqlite3.IntegrityError as error:
            write.error = error
    if grouped:
        connection.execute("COMMIT")


class SqliteStore:
    """One SQLite file under a data dir (use `await Store.open(data_dir)`, or `async with` on it)."""

    RELATIVE_PATH: ClassVar[Path]
    MIGRATIONS: ClassVar[Sequence[str]]
    WHAT: ClassVar[str]
    ERROR: ClassVar[type[SensoriumError]] = SensoriumError

    def __init__(self, connection: aiosqlite.Connection, path: Path) -> None:
        self._db = connection
        self._lock = anyio.Lock()
        self._queued: list[_QueuedWrite] = []
        self._reader: sqlite3.Connection | None = None
        self.path = path
        self.commits = 0  # transactions the write queue ran (one fsync each, failed ones included)

    @classmethod
    async def open(cls, data_dir: Path) -> Self:
        """Open (creating and migrating) the store's file under `data_dir`."""
        path = Path(data_dir) / cls.RELATIVE_PATH
        connection = await open_database(path, cls.MIGRATIONS, what=cls.WHAT, error=cls.ERROR)
        return cls(connection, path)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Checkpoint the WAL into the database file and close the connections (always closes them)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(sqlite3.Error):  # another thread's reader: it closes when freed
                reader.close()
        async with self._writing():
            try:
                if self._db.in_transaction:  # only a crashed write could leave one open
                    await self._db.execute("ROLLBACK")
                await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                await self._db.close()

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        """The write lock (a store whose writes must never be cut in half shields it)."""
        async with self._lock:
            yield

    async def _read(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Every row of a point read (an index lookup: tens of microseconds, so on the loop's thread).

        Read-only and never waiting: when SQLite cannot begin the read at once (a truncating checkpoint
        holds the WAL) or the reader cannot be used, the writer's connection answers instead.
        """
        try:
            return self._read_only().execute(sql, params).fetchall()  # fetchall ends the read transaction
        except sqlite3.Error:
            return list(await self._db.execute_fetchall(sql, params))

    def _read_only(self) -> sqlite3.Connection:
        if self._reader is None:
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            self._reader = sqlite3.connect(uri, uri=True, timeout=0, isolation_level=None)
        return self._reader

    @property
    def queued_writes(self) -> int:
        """Statements waiting for a commit that has not begun yet."""
        return len(self._queued)

    async def _commit(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one write statement; durable when this returns (the row count), sharing its commit.

        The statement joins the queue; whoever next holds the write lock commits everything queued in one
        transaction, so concurrent writers pay one fsync together (group commit). Shielded: a queued
        statement is committed whatever happens to its caller, and the caller waits for that commit.
        """
        write = _QueuedWrite(sql, params)
        self._queued.append(write)
        with anyio.CancelScope(shield=True):
            async with self._lock:  # `_writing()`, inlined on the hot path (this scope shields it already)
                if not write.done:
                    await self._commit_queued()
        if write.error is not None:
            raise write.error
        return write.rowcount

    async def _commit_queued(self) -> None:
        """Every queued statement in one transaction; a failed commit fails each of them."""
        batch, self._queued = self._queued, []
        try:
            await self._run_transaction(batch)
        except Exception as error:
            await self._roll_back()
            for write in batch:
                write.error = write.error or error
        finally:
            self.commits += 1
            for write in batch:
                write.done = True

    async def _run_transaction(self, batch: Sequence[_QueuedWrite]) -> None:
        """The batch, committed, in one job of the connection's thread: one round trip whatever its size,
        where each statement would be one (a thread hop and a GIL hand-off on the loop's path)."""
        # aiosqlite's own seam for a function on its thread (untyped; the version is pinned).
        await self._db._execute(lambda: _commit_group(self._db._conn, batch))  # type: ignore[no-untyped-call]

    async def _roll_back(self) -> None:
        """End a transaction that could not commit (nothing of it is durable)."""
        if self._db.in_transaction:
            try:
                await self._db.execute("ROLLBACK")
            except aiosqlite.Error as error:  # unusable connection: the callers hear of the first error
                _log.error("rolling back a failed commit failed with %s", type(error).__name__)

    async def checkpoint(self) -> None:
        """Copy the WAL into the database file and truncate the WAL to zero bytes."""
        async with self._writing():
            await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def pragma(self, name: str) -> Any:
        """Read one PRAGMA value (health checks and tests)."""
        if not name.isidentifier():
            raise self.ERROR("pragma name is malformed", code=Code.INTERNAL)
        rows = await self._db.execute_fetchall(f"PRAGMA {name}")
        return next(iter(rows), (None,))[0]
