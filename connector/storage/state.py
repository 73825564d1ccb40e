"""Durable connector state: bindings and operations (`<data-dir>/modules/sensorium-os/state.sqlite`).

Rules of this file:
- only bindings (CONTRACT §6.6: id, owner, transport, address, bound_at - no candidate ref, no label), command
  operations and discovery operation records are stored; discovery candidates never reach this database;
  a binding's keyed retries find it by a keyed digest of the caller's principal, operation and key only
  (`connector.core.ids.bind_replay_digest`; no ref, no digest of one), erased with the binding;
- a discovery record is the durable metadata of CONTRACT §7 (`connector.core.projections.durable_metadata`),
  the caller's `causal/context`, the final revision number and the first answer (the deferred handle);
  never a candidate, a fingerprint of the directive, or anything derived from candidate content;
- a forgotten binding is erased: a real DELETE under `secure_delete`, then a truncating WAL checkpoint so
  that no copy of the row stays in the WAL file either; every read runs in one job of the connection's
  thread, so no statement of ours is open when that checkpoint runs;
- a command's input is kept only while its work is pending or running and cleared at the terminal state;
- one connection; every write goes through one lock and commits before the caller sees the change
  (concurrent writes share one commit).
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import aiosqlite

from connector.core.clock import format_time, parse_time
from connector.core.lifecycle import TERMINAL_STATUSES
from connector.errors import Code, SensoriumError
from connector.storage.sqlite import SqliteStore

STATE_RELATIVE_PATH = Path("modules") / "sensorium-os" / "state.sqlite"

_log = logging.getLogger(__name__)

# Append only: migration N (1-based) moves `user_version` from N-1 to N.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE bindings (
        binding_id TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        transport  TEXT NOT NULL,
        address    TEXT NOT NULL,
        bound_at   TEXT NOT NULL
    );
    CREATE TABLE command_operations (
        operation_id   TEXT PRIMARY KEY,
        owner          TEXT NOT NULL,
        action_id      TEXT NOT NULL,
        mode           TEXT NOT NULL CHECK (mode IN ('sync', 'async')),
        status         TEXT NOT NULL,
        created_at     TEXT NOT NULL,
        updated_at     TEXT NOT NULL,
        expires_at     TEXT NOT NULL,
        input_json     TEXT,
        result_json    TEXT,
        error_code     TEXT,
        cancelable     INTEGER NOT NULL,
        idempotency_fp TEXT,
        causal_context_json TEXT
    );
    CREATE INDEX command_operations_status ON command_operations (status);
    """,
    """
    CREATE TABLE discovery_operations (
        operation_id   TEXT PRIMARY KEY,
        owner          TEXT NOT NULL,
        action_id      TEXT NOT NULL,
        transport      TEXT NOT NULL,
        status         TEXT NOT NULL,
        ended_at_ms    INTEGER,
        metadata_json  TEXT NOT NULL,
        causal_context_json TEXT,
        final_revision INTEGER NOT NULL DEFAULT 0,
        reply_json     TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX discovery_operations_status ON discovery_operations (status);
    CREATE INDEX discovery_operations_ended ON discovery_operations (ended_at_ms);
    """,
    """
    CREATE TABLE binding_replays (
        replay_digest TEXT PRIMARY KEY,
        binding_id    TEXT NOT NULL REFERENCES bindings (binding_id) ON DELETE CASCADE
    ) WITHOUT ROWID;
    CREATE INDEX binding_replays_binding ON binding_replays (binding_id);
    CREATE TABLE state_secrets (
        name   TEXT PRIMARY KEY,
        secret BLOB NOT NULL
    ) WITHOUT ROWID;
    """,
)
_REPLAY_SECRET = "bind-replay"

Mode = Literal["sync", "async"]


@dataclass(frozen=True, slots=True)
class Binding:
    """A durable binding (CONTRACT §6.8): the only stored thing that holds a transport address."""

    binding_id: str
    owner: str
    transport: str
    address: str
    bound_at: datetime


@dataclass(frozen=True, slots=True)
class CommandOperation:
    """One command action's operation row; statuses are `connector.core.lifecycle.Status` values."""

    operation_id: str
    owner: str
    action_id: str
    mode: Mode
    status: str
    created_at: datetime
    updated_at: datetime
    expires_at: datetime
    cancelable: bool
    input_json: str | None = None
    result_json: str | None = None
    error_code: str | None = None
    idempotency_fp: str | None = None
    causal_context_json: str | None = None

    @property
    def result(self) -> Any:
        """The decoded `result.json` value (None when there is none)."""
        return None if self.result_json is None else json.loads(self.result_json)


@dataclass(frozen=True, slots=True)
class DiscoveryRecord:
    """The durable record of one discovery operation (CONTRACT §7 metadata; no candidate data)."""

    operation_id: str
    owner: str
    action_id: str
    transport: str
    status: str
    metadata: dict[str, Any]
    reply: dict[str, Any]
    causal_context: dict[str, Any] | None = None
    final_revision: int = 0
    ended_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Located:
    """Where an operation id is recorded, and whose it is (one lookup for every kind)."""

    kind: Literal["discovery", "command"]
    owner: str
    action_id: str
    transport: str | None
    discovery: DiscoveryRecord | None = None


_DISCOVERY_COLUMNS = (
    "operation_id, owner, action_id, transport, status, ended_at_ms, metadata_json, causal_context_json, "
    "final_revision, reply_json"
)
# One statement for both kinds: an id nobody recorded costs exactly what another principal's id costs.
_LOCATE = (
    f"SELECT 'discovery', {_DISCOVERY_COLUMNS} FROM discovery_operations WHERE operation_id = ? "
    "UNION ALL SELECT 'command', operation_id, owner, action_id, NULL, status, NULL, NULL, NULL, 0, NULL "
    "FROM command_operations WHERE operation_id = ? LIMIT 1"
)
_TERMINAL_STATUSES = tuple(sorted(status.value for status in TERMINAL_STATUSES))


_OPERATION_COLUMNS = (
    "operation_id, owner, action_id, mode, status, created_at, updated_at, expires_at, input_json, "
    "result_json, error_code, cancelable, idempotency_fp, causal_context_json"
)


class ConnectorState(SqliteStore):
    """The connector's SQLite store (use `await ConnectorState.open(data_dir)` or `async with`)."""

    RELATIVE_PATH = STATE_RELATIVE_PATH
    MIGRATIONS = MIGRATIONS
    WHAT = "state database"

    def __init__(self, connection: aiosqlite.Connection, path: Path) -> None:
        super().__init__(connection, path)
        self._wal_owed = False

    async def compact(self) -> None:
        """Rebuild the file (VACUUM) and truncate the WAL: no freed page keeps bytes of cleared values.

        `secure_delete` zeroes what this connection frees; pages left behind by a killed process are not
        covered by it, so recovery compacts once after clearing interrupted inputs.
        """
        async with self._lock:
            await self._db.execute("VACUUM")
            await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    # -- bindings -------------------------------------------------------------------------------------

    async def insert_binding(self, binding: Binding, replay_digest: str | None = None) -> None:
        """Store a new binding, with the digest its keyed retries find it by (one commit); `internal` if
        the id (random) or the digest is already taken."""
        sql = "INSERT INTO bindings (binding_id, owner, transport, address, bound_at) VALUES (?, ?, ?, ?, ?)"
        params = (
            binding.binding_id,
            binding.owner,
            binding.transport,
            binding.address,
            format_time(binding.bound_at),
        )
        replay = "INSERT INTO binding_replays (replay_digest, binding_id) VALUES (?, ?)"
        async with self._lock:
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                await self._db.execute(sql, params)
                if replay_digest is not None:
                    await self._db.execute(replay, (replay_digest, binding.binding_id))
                await self._db.execute("COMMIT")
            except aiosqlite.IntegrityError as error:
                await self._db.execute("ROLLBACK")
                raise SensoriumError("binding id already exists", code=Code.INTERNAL) from error
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise

    async def replayed_binding(self, replay_digest: str) -> Binding | None:
        """The binding a keyed bind stored under this digest, while it exists."""
        sql = (
            "SELECT b.binding_id, b.owner, b.transport, b.address, b.bound_at FROM binding_replays r "
            "JOIN bindings b USING (binding_id) WHERE r.replay_digest = ?"
        )
        row = await self._first(sql, (replay_digest,))
        return None if row is None else Binding(row[0], row[1], row[2], row[3], parse_time(row[4]))

    async def replay_secret(self) -> bytes:
        """The random secret that keys bind replay digests (created once, kept with the state)."""
        sql = "SELECT secret FROM state_secrets WHERE name = ?"
        async with self._lock:
            row = await self._first(sql, (_REPLAY_SECRET,))
            if row is None:
                fresh = secrets.token_bytes(32)
                insert = "INSERT INTO state_secrets (name, secret) VALUES (?, ?)"
                cursor = await self._db.execute(insert, (_REPLAY_SECRET, fresh))
                await cursor.close()
                return fresh
        secret: bytes = row[0]
        return secret

    async def get_binding(self, binding_id: str) -> Binding | None:
        """The binding with this id, or None."""
        sql = "SELECT binding_id, owner, transport, address, bound_at FROM bindings WHERE binding_id = ?"
        row = await self._first(sql, (binding_id,))
        if row is None:
            return None
        return Binding(row[0], row[1], row[2], row[3], parse_time(row[4]))

    async def list_bindings(self, owner: str | None) -> list[Binding]:
        """Every binding of `owner` (every binding when None), oldest first."""
        sql = "SELECT binding_id, owner, transport, address, bound_at FROM bindings"
        params: tuple[str, ...] = ()
        if owner is not None:
            sql, params = sql + " WHERE owner = ?", (owner,)
        rows = await self._rows(sql + " ORDER BY bound_at, binding_id", params)
        return [Binding(r[0], r[1], r[2], r[3], parse_time(r[4])) for r in rows]

    async def delete_binding(self, binding_id: str) -> bool:
        """Erase a binding (secure delete + WAL truncation); True when one existed."""
        async with self._lock:
            cursor = await self._db.execute("DELETE FROM bindings WHERE binding_id = ?", (binding_id,))
            deleted = cursor.rowcount > 0
            await cursor.close()
            if deleted or self._wal_owed:
                await self._erase_wal()
        return deleted

    # -- command operations ---------------------------------------------------------------------------

    async def insert_operation(self, operation: CommandOperation) -> None:
        """Store a new command operation; `internal` if the id already exists."""
        sql = f"INSERT INTO command_operations ({_OPERATION_COLUMNS}) VALUES ({', '.join('?' * 14)})"
        try:
            await self._write(sql, _operation_row(operation))
        except aiosqlite.IntegrityError as error:
            raise SensoriumError("operation id already exists", code=Code.INTERNAL) from error

    async def update_operation(self, operation: CommandOperation) -> None:
        """Replace the mutable fields of an existing operation row."""
        sql = (
            "UPDATE command_operations SET status = ?, updated_at = ?, input_json = ?, result_json = ?, "
            "error_code = ? WHERE operation_id = ?"
        )
        params = (
            operation.status,
            format_time(operation.updated_at),
            operation.input_json,
            operation.result_json,
            operation.error_code,
            operation.operation_id,
        )
        if await self._write(sql, params) != 1:
            raise SensoriumError("no such operation", code=Code.UNKNOWN_OPERATION)

    async def get_operation(self, operation_id: str) -> CommandOperation | None:
        """The operation row with this id, or None."""
        sql = f"SELECT {_OPERATION_COLUMNS} FROM command_operations WHERE operation_id = ?"
        row = await self._first(sql, (operation_id,))
        return None if row is None else _operation_from_row(row)

    async def list_operations(self, statuses: Iterable[str] | None = None) -> list[CommandOperation]:
        """Operation rows, optionally only those in `statuses`, oldest first."""
        sql = f"SELECT {_OPERATION_COLUMNS} FROM command_operations"
        wanted = tuple(statuses) if statuses is not None else None
        params: tuple[str, ...] = ()
        if wanted is not None:
            sql += f" WHERE status IN ({', '.join('?' * len(wanted))})" if wanted else " WHERE 0"
            params = wanted
        rows = await self._rows(sql + " ORDER BY created_at, operation_id", params)
        return [_operation_from_row(row) for row in rows]

    async def delete_operations_before(self, statuses: Iterable[str], updated_before: datetime) -> int:
        """Forget rows in `statuses` updated before the cutoff (terminal retention); returns the count."""
        wanted = tuple(statuses)
        if not wanted:
            return 0
        sql = (
            f"DELETE FROM command_operations WHERE status IN ({', '.join('?' * len(wanted))}) "
            "AND updated_at < ?"
        )
        return await self._write(sql, (*wanted, format_time(updated_before)))

    # -- discovery records ----------------------------------------------------------------------------

    async def insert_discovery(self, record: DiscoveryRecord) -> None:
        """Store the record of a newly accepted scan (before its 202 leaves)."""
        sql = f"INSERT INTO discovery_operations ({_DISCOVERY_COLUMNS}) VALUES ({', '.join('?' * 10)})"
        try:
            await self._write(sql, _discovery_row(record))
        except aiosqlite.IntegrityError as error:
            raise SensoriumError("operation id already exists", code=Code.INTERNAL) from error

    async def update_discovery(
        self, operation_id: str, metadata: dict[str, Any], *, final_revision: int, ended_at_ms: int | None
    ) -> None:
        """Record a lifecycle change (terminal status, late cleanup, erasure) of a scan."""
        sql = (
            "UPDATE discovery_operations SET status = ?, metadata_json = ?, final_revision = ?, "
            "ended_at_ms = COALESCE(ended_at_ms, ?) WHERE operation_id = ?"
        )
        params = (metadata["status"], _dump(metadata), final_revision, ended_at_ms, operation_id)
        await self._write(sql, params)

    async def get_discovery(self, operation_id: str) -> DiscoveryRecord | None:
        """The record of a scan, or None."""
        sql = f"SELECT {_DISCOVERY_COLUMNS} FROM discovery_operations WHERE operation_id = ?"
        rows = await self._read(sql, (operation_id,))
        return _discovery_from_row(tuple(rows[0])) if rows else None

    async def list_discoveries(self, limit: int = 500) -> list[DiscoveryRecord]:
        """Scan records: open ones first, then the most recently ended (operator views: metadata only)."""
        sql = (
            f"SELECT {_DISCOVERY_COLUMNS} FROM discovery_operations "
            "ORDER BY ended_at_ms IS NULL DESC, ended_at_ms DESC LIMIT ?"
        )
        rows = await self._rows(sql, (max(0, int(limit)),))
        return [_discovery_from_row(row) for row in rows]

    async def locate(self, operation_id: str) -> Located | None:
        """Kind, owner, action and transport of any recorded operation (with a scan's record), or None."""
        rows = await self._read(_LOCATE, (operation_id, operation_id))  # not behind the write queue
        if not rows:
            return None
        row = rows[0]
        if row[0] == "command":
            return Located("command", row[2], row[3], None)
        record = _discovery_from_row(tuple(row[1:]))
        return Located("discovery", record.owner, record.action_id, record.transport, record)

    async def interrupt_discoveries(self, now_ms: int, stamp: str) -> tuple[int, int]:
        """After a restart: unfinished scans end `failed` `interrupted-by-restart` with cleanup confirmed and
        the claim released (CONTRACT §6.6, 6.7: the old process's sessions died with it); a retained completed
        result is erased (`erased_at` = `stamp`). Returns (scans interrupted, results erased)."""
        interrupted = erased = 0
        sql = f"SELECT {_DISCOVERY_COLUMNS} FROM discovery_operations WHERE status IN ('pending', 'running') "
        sql += "OR (status = 'completed' AND metadata_json NOT LIKE '%\"erased_at\"%')"
        for row in await self._rows(sql, ()):
            record = _discovery_from_row(row)
            metadata = interrupted_metadata(record.metadata, stamp)
            await self.update_discovery(
                record.operation_id, metadata, final_revision=record.final_revision, ended_at_ms=now_ms
            )
            if record.metadata.get("status") == "completed":
                erased += 1
            else:
                interrupted += 1
        return interrupted, erased

    async def delete_discoveries_ended_before(self, cutoff_ms: int) -> int:
        """Metadata retention: forget scans that ended before the cutoff; returns the count."""
        placeholders = ", ".join("?" * len(_TERMINAL_STATUSES))
        sql = (
            f"DELETE FROM discovery_operations WHERE status IN ({placeholders}) "
            "AND ended_at_ms IS NOT NULL AND ended_at_ms < ?"
        )
        return await self._write(sql, (*_TERMINAL_STATUSES, cutoff_ms))

    # -- internals ------------------------------------------------------------------------------------

    async def _rows(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """Every row of a read, in one job of the connection's thread.

        One job: no statement stays open between two awaits, where another task's truncating checkpoint
        would find the table locked by this connection's own reader.
        """
        return [tuple(row) for row in await self._db.execute_fetchall(sql, params)]

    async def _first(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The first row of a read (one job, as `_rows`), or None."""
        return next(iter(await self._rows(sql, params)), None)

    async def _erase_wal(self) -> None:
        """Truncate the WAL, so that no freed copy of an erased row stays there.

        Another process still reading an older snapshot past the busy timeout blocks it: the erasure
        stands (the row is gone), and the truncation is owed to the next erasure or the close.
        """
        try:
            rows = await self._db.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
            blocked = next(iter(rows), (1,))[0] != 0  # (busy, log, checkpointed)
        except aiosqlite.OperationalError:  # the table is locked by a reader of this connection
            blocked = True
        self._wal_owed = blocked
        if blocked:
            _log.warning("the WAL truncation after an erasure is owed (a reader held the database)")

    async def _write(self, sql: str, params: tuple[Any, ...]) -> int:
        """Run one write statement, committed (synchronous=FULL) on return; returns the row count.

        Concurrent writes share one commit (`SqliteStore._commit`, CONTRACT §7).
        """
        return await self._commit(sql, params)


def interrupted_metadata(metadata: dict[str, Any], stamp: str) -> dict[str, Any]:
    """Durable metadata of a scan the restart cut: failed, interrupted, cleanup confirmed, claim released."""
    changed = dict(metadata)
    if changed.get("status") == "completed":
        changed["erased_at"] = changed.get("erased_at", stamp)
        return changed
    changed.update(status="failed", error_code=Code.INTERRUPTED_BY_RESTART, updated_at=stamp)
    changed["cleanup"] = {"state": "confirmed", "claim": "released"}
    changed.pop("reason", None)
    return changed


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _discovery_row(record: DiscoveryRecord) -> tuple[Any, ...]:
    """Column values in `_DISCOVERY_COLUMNS` order."""
    return (
        record.operation_id,
        record.owner,
        record.action_id,
        record.transport,
        record.status,
        record.ended_at_ms,
        _dump(record.metadata),
        None if record.causal_context is None else _dump(record.causal_context),
        record.final_revision,
        _dump(record.reply),
    )


def _discovery_from_row(row: tuple[Any, ...]) -> DiscoveryRecord:
    """A row in `_DISCOVERY_COLUMNS` order back into a `DiscoveryRecord`."""
    return DiscoveryRecord(
        operation_id=row[0],
        owner=row[1],
        action_id=row[2],
        transport=row[3],
        status=row[4],
        ended_at_ms=row[5],
        metadata=json.loads(row[6]),
        causal_context=None if row[7] is None else json.loads(row[7]),
        final_revision=row[8],
        reply=json.loads(row[9]),
    )


def _operation_row(op: CommandOperation) -> tuple[Any, ...]:
    """Column values in `_OPERATION_COLUMNS` order."""
    return (
        op.operation_id,
        op.owner,
        op.action_id,
        op.mode,
        op.status,
        format_time(op.created_at),
        format_time(op.updated_at),
        format_time(op.expires_at),
        op.input_json,
        op.result_json,
        op.error_code,
        int(op.cancelable),
        op.idempotency_fp,
        op.causal_context_json,
    )


def _operation_from_row(row: tuple[Any, ...]) -> CommandOperation:
    """A row in `_OPERATION_COLUMNS` order back into a `CommandOperation`."""
    mode: Mode = "async" if row[3] == "async" else "sync"
    return CommandOperation(
        operation_id=row[0],
        owner=row[1],
        action_id=row[2],
        mode=mode,
        status=row[4],
        created_at=parse_time(row[5]),
        updated_at=parse_time(row[6]),
        expires_at=parse_time(row[7]),
        input_json=row[8],
        result_json=row[9],
        error_code=row[10],
        cancelable=bool(row[11]),
        idempotency_fp=row[12],
        causal_context_json=row[13],
    )
