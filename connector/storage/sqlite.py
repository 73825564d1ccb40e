"""One way to open this project's SQLite files: private mode, WAL, full fsync, secure delete, migrations."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import aiosqlite

from connector.errors import SensoriumError
from connector.storage.files import make_private_dir

# aiosqlite logs SQL parameters (binding addresses among them) at DEBUG: never below INFO here.
logging.getLogger("aiosqlite").setLevel(logging.INFO)

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
        raise error(f"{what} refused WAL mode", code="internal")
    for pragma in PRAGMAS:
        await connection.execute(f"PRAGMA {pragma}")


async def _migrate(
    connection: aiosqlite.Connection, migrations: Sequence[str], what: str, error: type[SensoriumError]
) -> None:
    """Apply every migration past the stored `user_version`, each in its own transaction."""
    rows = await connection.execute_fetchall("PRAGMA user_version")
    version = int(next(iter(rows), (0,))[0] or 0)
    if version > len(migrations):
        raise error(f"{what} is newer than this program", code="internal")
    for number, script in enumerate(migrations[version:], start=version + 1):
        await connection.executescript(
            f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;"
        )
