"""The reference host's registry of deferred operations: `<data-dir>/storage/deferred-operations.sqlite`.

Rules of this file:
- it stores DURABLE METADATA only (CONTRACT §7): the row's `metadata` is the durable projection the host hands
  in, never a caller-private status, snapshot, candidate, result or input; history events hold a SHA-256
  over that metadata and nothing else;
- one statement per status change: the row UPDATE fires a trigger that appends the history event in the
  same implicit transaction, only when the metadata digest or the status changed; with WAL and
  `synchronous=FULL` the change is on disk when the call returns (kill -9 safe);
- a terminal status never changes again: the UPDATE only matches rows whose current status may be
  followed by the new one (`connector.core.lifecycle.check_observed`, host role); a terminal row may still
  refresh its metadata under the same status (a late cleanup acknowledgement, an erased result);
- raw continuations live in their own table, are never listed, and are handed out exactly once
  (`claim_resume`), which also drops their body;
- times are stored as integer milliseconds since the Unix epoch, UTC.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from connector.contract.canonical import canonical_bytes
from connector.core.clock import from_ms, to_ms, wall_clock
from connector.core.lifecycle import (
    INTERRUPTED_BY_RESTART,
    TERMINAL_STATUSES,
    IllegalTransition,
    Role,
    Status,
    check_observed,
    is_terminal,
)
from connector.errors import Code, SensoriumError
from connector.storage.registry_reader import RegistryReader
from connector.storage.sqlite import SqliteStore

REGISTRY_RELATIVE_PATH = Path("storage") / "deferred-operations.sqlite"
DEFAULT_RETENTION = timedelta(days=7)

_log = logging.getLogger(__name__)
_SAFE_INT = 2**53
_TERMINAL = tuple(sorted(s.value for s in TERMINAL_STATUSES))
_NON_TERMINAL = tuple(sorted(s.value for s in Status if not is_terminal(s)))

# Append only: migration N (1-based) moves `user_version` from N-1 to N.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE operations (
        operation_id              TEXT PRIMARY KEY,
        operation_kind            TEXT NOT NULL,
        owner_module_id           TEXT NOT NULL,
        capability_id             TEXT NOT NULL,
        owner                     TEXT NOT NULL,
        status                    TEXT NOT NULL,
        retry_after_seconds       INTEGER,
        next_poll_at              INTEGER,
        expires_at                INTEGER NOT NULL,
        attempts                  INTEGER NOT NULL DEFAULT 0,
        cancelable                INTEGER NOT NULL,
        cancel_unavailable_reason TEXT,
        correlation_id            TEXT,
        continuation_digest       TEXT,
        diagnostics_digest        TEXT,
        last_error                TEXT,
        created_at                INTEGER NOT NULL,
        updated_at                INTEGER NOT NULL,
        bus_op                    TEXT,
        causal_context            TEXT,
        handle                    TEXT NOT NULL,
        metadata                  TEXT NOT NULL,
        metadata_digest           TEXT NOT NULL,
        version                   INTEGER NOT NULL DEFAULT 1,
        terminal_version          INTEGER
    );
    CREATE INDEX operations_due ON operations (next_poll_at) WHERE next_poll_at IS NOT NULL;
    CREATE UNIQUE INDEX operations_bus_op ON operations (owner, bus_op) WHERE bus_op IS NOT NULL;
    CREATE TABLE status_history (
        operation_id TEXT NOT NULL REFERENCES operations (operation_id) ON DELETE CASCADE,
        seq          INTEGER NOT NULL,
        at           INTEGER NOT NULL,
        status       TEXT NOT NULL,
        digest       TEXT NOT NULL,
        PRIMARY KEY (operation_id, seq)
    ) WITHOUT ROWID;
    CREATE TABLE continuations (
        operation_id TEXT PRIMARY KEY REFERENCES operations (operation_id) ON DELETE CASCADE,
        body         TEXT,
        claimed_at   INTEGER
    );
    CREATE TRIGGER history_on_accept AFTER INSERT ON operations
    BEGIN
        INSERT INTO status_history (operation_id, seq, at, status, digest)
        VALUES (NEW.operation_id, 1, NEW.updated_at, NEW.status, NEW.metadata_digest);
    END;
    CREATE TRIGGER history_on_change AFTER UPDATE ON operations
    WHEN NEW.metadata_digest IS NOT OLD.metadata_digest OR NEW.status IS NOT OLD.status
    BEGIN
        INSERT INTO status_history (operation_id, seq, at, status, digest)
        SELECT NEW.operation_id, coalesce(max(seq), 0) + 1, NEW.updated_at, NEW.status, NEW.metadata_digest
        FROM status_history WHERE operation_id = NEW.operation_id;
    END;
    """,
)

# Fixed at acceptance (cached per operation) / changed by status updates.
_FIXED_COLUMNS = (
    "operation_id, operation_kind, owner_module_id, capability_id, owner, expires_at, cancelable, "
    "cancel_unavailable_reason, correlation_id, created_at, bus_op, causal_context, handle"
)
_CHANGING_COLUMNS = (
    "status, retry_after_seconds, next_poll_at, attempts, continuation_digest, diagnostics_digest, "
    "last_error, updated_at"
)
_COLUMNS = f"{_FIXED_COLUMNS}, {_CHANGING_COLUMNS}, metadata"
_FIXED_COUNT = 13
_FIXED_CACHE_SIZE = 4096
_INSERT_COLUMNS = _COLUMNS + ", metadata_digest"

TerminalListener = Callable[["OperationRecord"], Awaitable[None] | None]


class RegistryError(SensoriumError):
    """The registry could not do what was asked (never carries stored values)."""

    default_code = Code.INTERNAL


def _plain(value: Any) -> bool:
    """True for JSON whose RFC 8785 form `json.dumps` writes exactly: ASCII keys, no floats, safe ints."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return True
    if kind is int:
        return bool(-_SAFE_INT < value < _SAFE_INT)
    if kind is dict:
        return all(type(k) is str and k.isascii() and _plain(v) for k, v in value.items())
    if kind is list:
        return all(_plain(v) for v in value)
    return False


def canonical(value: Mapping[str, Any]) -> bytes:
    """RFC 8785 bytes of a JSON object, by `json.dumps` where that is provably the same, else by `rfc8785`."""
    # With ASCII keys (UTF-16 and code point order agree), no floats and safe integers, a sorted compact
    # json.dumps with ensure_ascii=False escapes exactly as ECMAScript does, and is several times faster.
    document = dict(value)
    if _plain(document):
        try:
            return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        except UnicodeEncodeError:  # a lone surrogate: let rfc8785 refuse it
            pass
    return canonical_bytes(document)


@dataclass(frozen=True, slots=True)
class OperationRecord:
    """One operation as the host keeps it: control-plane fields plus the latest durable metadata."""

    operation_id: str
    operation_kind: str
    owner_module_id: str
    capability_id: str
    owner: str
    status: str
    retry_after_seconds: int | None
    next_poll_at: datetime | None
    expires_at: datetime
    attempts: int
    cancelable: bool
    cancel_unavailable_reason: str | None
    correlation_id: str | None
    continuation_digest: str | None
    diagnostics_digest: str | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    bus_op: str | None
    metadata: Mapping[str, Any]
    causal_context: Mapping[str, Any] | None = None
    handle: Mapping[str, Any] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        """True once the status never changes again."""
        return is_terminal(Status(self.status))


@dataclass(frozen=True, slots=True)
class HistoryEvent:
    """One digest-only status-history event."""

    seq: int
    at: datetime
    status: str
    digest: str


def _json(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else canonical(value).decode("utf-8")


def _as_sent(value: Mapping[str, Any]) -> str:
    """JSON in the order it was written (a replayed handle must be the first answer, byte for byte)."""
    return json.dumps(dict(value), separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class _Fixed:
    """What an operation row never changes after acceptance (JSON kept as text: records get fresh copies)."""

    operation_id: str
    operation_kind: str
    owner_module_id: str
    capability_id: str
    owner: str
    expires_at: datetime
    cancelable: bool
    cancel_unavailable_reason: str | None
    correlation_id: str | None
    created_at: datetime
    bus_op: str | None
    causal_context: str | None
    handle: str

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> _Fixed:
        """The first `_FIXED_COUNT` values of a row in `_COLUMNS` order."""
        return cls(
            row[0], row[1], row[2], row[3], row[4], from_ms(row[5]), bool(row[6]), row[7], row[8],
            from_ms(row[9]), row[10], row[11], row[12],
        )  # fmt: skip

    def record(self, changing: tuple[Any, ...], metadata: str | Mapping[str, Any]) -> OperationRecord:
        """A record from these fixed parts, the `_CHANGING_COLUMNS` values and the metadata (text or dict)."""
        return OperationRecord(
            operation_id=self.operation_id,
            operation_kind=self.operation_kind,
            owner_module_id=self.owner_module_id,
            capability_id=self.capability_id,
            owner=self.owner,
            status=changing[0],
            retry_after_seconds=changing[1],
            next_poll_at=None if changing[2] is None else from_ms(changing[2]),
            expires_at=self.expires_at,
            attempts=changing[3],
            cancelable=self.cancelable,
            cancel_unavailable_reason=self.cancel_unavailable_reason,
            correlation_id=self.correlation_id,
            continuation_digest=changing[4],
            diagnostics_digest=changing[5],
            last_error=changing[6],
            created_at=self.created_at,
            updated_at=from_ms(changing[7]),
            bus_op=self.bus_op,
            metadata=json.loads(metadata) if isinstance(metadata, str) else dict(metadata),
            causal_context=None if self.causal_context is None else json.loads(self.causal_context),
            handle=json.loads(self.handle),
        )


def _row(record: OperationRecord) -> tuple[Any, ...]:
    """Column values in `_INSERT_COLUMNS` order."""
    return (
        record.operation_id,
        record.operation_kind,
        record.owner_module_id,
        record.capability_id,
        record.owner,
        to_ms(record.expires_at),
        int(record.cancelable),
        record.cancel_unavailable_reason,
        record.correlation_id,
        to_ms(record.created_at),
        record.bus_op,
        _json(record.causal_context),
        _as_sent(record.handle),
        Status(record.status).value,
        record.retry_after_seconds,
        None if record.next_poll_at is None else to_ms(record.next_poll_at),
        record.attempts,
        record.continuation_digest,
        record.diagnostics_digest,
        record.last_error,
        to_ms(record.updated_at),
        *_metadata_columns(record.metadata),
    )


def _metadata_columns(metadata: Mapping[str, Any]) -> tuple[str, str]:
    """The stored metadata text and its digest, from one canonical encoding."""
    body = canonical(metadata)
    return body.decode("utf-8"), hashlib.sha256(body).hexdigest()


def _sources(new: Status) -> tuple[str, ...]:
    """Every status a row may be in for `new` to be observed next (host role)."""
    allowed = []
    for previous in Status:
        try:
            check_observed(previous, new, role=Role.HOST)
        except IllegalTransition:
            continue
        allowed.append(previous.value)
    return tuple(allowed)


def _marks(count: int) -> str:
    return ", ".join("?" * count)


_SOURCES: Mapping[Status, tuple[str, ...]] = {status: _sources(status) for status in Status}
# One statement per status change: the trigger appends the history event; RETURNING hands back the row and
# whether this very update made it terminal (`terminal_version` set to the new `version`).
_UPDATE_SQL: Mapping[Status, str] = {
    status: (
        "UPDATE operations SET status = ?, metadata = ?, metadata_digest = ?, updated_at = ?, "
        "retry_after_seconds = ?, next_poll_at = ?, attempts = coalesce(?, attempts), "
        "last_error = coalesce(?, last_error), diagnostics_digest = coalesce(?, diagnostics_digest), "
        "version = version + 1, terminal_version = CASE WHEN terminal_version IS NULL AND ? "
        "THEN version + 1 ELSE terminal_version END "
        f"WHERE operation_id = ? AND status IN ({_marks(len(_SOURCES[status]))}) "
        f"RETURNING {_CHANGING_COLUMNS}, version, terminal_version"
    )
    for status in Status
}


class DeferredRegistry(SqliteStore):
    """The host's SQLite registry (`await DeferredRegistry.open(data_dir)`, or `async with`)."""

    RELATIVE_PATH = REGISTRY_RELATIVE_PATH
    MIGRATIONS = MIGRATIONS
    WHAT = "registry database"
    ERROR = RegistryError

    def __init__(self, connection: aiosqlite.Connection, path: Path) -> None:
        super().__init__(connection, path)
        # Serialises writes on the one connection (explicit transactions must not interleave); uncontended,
        # it costs no trip through the event loop.
        self._lock = anyio.Lock(fast_acquire=True)
        self._listeners: builtins.list[TerminalListener] = []
        self._fixed: OrderedDict[str, _Fixed] = OrderedDict()

    @asynccontextmanager
    async def _writing(self) -> AsyncIterator[None]:
        """The write lock, shielded: a cancelled caller never leaves a statement or transaction half done."""
        with anyio.CancelScope(shield=True):
            async with self._lock:
                yield

    # ---- writes --------------------------------------------------------------------------------------------

    async def record_accepted(self, record: OperationRecord) -> bool:
        """Insert an accepted operation and its first history event (durable on return); False if known."""
        sql = (
            f"INSERT INTO operations ({_INSERT_COLUMNS}) VALUES ({_marks(23)}) "
            "ON CONFLICT (operation_id) DO NOTHING"
        )
        row = _row(record)
        try:
            async with self._writing():
                cursor = await self._db.execute(sql, row)
                inserted = cursor.rowcount == 1
                await cursor.close()
        except aiosqlite.IntegrityError as error:  # the (owner, bus_op) pair is taken by another operation
            raise RegistryError("operation conflicts with a recorded one") from error
        if inserted:
            self._remember(_Fixed.from_row(row))
        return inserted

    async def record_status(
        self,
        operation_id: str,
        *,
        status: str,
        metadata: Mapping[str, Any],
        now: datetime,
        retry_after_seconds: int | None,
        next_poll_at: datetime | None,
        attempts: int | None = None,
        last_error: str | None = None,
        diagnostics_digest: str | None = None,
        notify: bool = True,
    ) -> OperationRecord:
        """Row update + history event in one statement; refuses leaving a terminal status.

        `attempts`, `last_error` and `diagnostics_digest` keep their stored value when None. Terminal
        listeners fire once, when this call is the one that made the operation terminal (unless `notify`
        is False).
        """
        new = Status(status)
        terminal = is_terminal(new)
        fixed = self._fixed.get(operation_id) or await self._load_fixed(operation_id)
        text, digest = _metadata_columns(metadata)
        params = (
            new.value,
            text,
            digest,
            to_ms(now),
            None if terminal else retry_after_seconds,
            None if terminal or next_poll_at is None else to_ms(next_poll_at),
            attempts,
            last_error,
            diagnostics_digest,
            int(terminal),
            operation_id,
            *_SOURCES[new],
        )
        with anyio.CancelScope(shield=True):  # `_writing()`, inlined on the hot path
            async with self._lock:
                rows = await self._db.execute_fetchall(_UPDATE_SQL[new], params)
        row = next(iter(rows), None)
        if row is None:
            await self._refuse(operation_id, new)
        assert row is not None
        record = fixed.record(tuple(row), metadata)  # a shallow copy of what was stored
        if notify and row[-1] is not None and row[-1] == row[-2]:
            await self._fire(record)
        return record

    async def _load_fixed(self, operation_id: str) -> _Fixed:
        """The fixed part of a row not in the cache (`unknown-operation` when there is no row)."""
        record = await self.get(operation_id)
        found = self._fixed.get(operation_id)
        if record is None or found is None:
            raise RegistryError("no such operation", code=Code.UNKNOWN_OPERATION)
        return found

    def _remember(self, fixed: _Fixed) -> None:
        self._fixed[fixed.operation_id] = fixed
        self._fixed.move_to_end(fixed.operation_id)
        while len(self._fixed) > _FIXED_CACHE_SIZE:
            self._fixed.popitem(last=False)

    async def _refuse(self, operation_id: str, new: Status) -> None:
        current = await self.get(operation_id)
        if current is None:
            raise RegistryError("no such operation", code=Code.UNKNOWN_OPERATION)
        raise IllegalTransition(Status(current.status), new)

    async def mark_interrupted(
        self, now: datetime, *, capability_ids: Collection[str] | None = None
    ) -> builtins.list[OperationRecord]:
        """Every non-terminal operation (of `capability_ids`, when given) -> `failed` interrupted-by-restart.

        Fires no terminal listeners: the caller reports the returned records itself (nothing is connected
        yet at start-up).
        """
        wanted = None if capability_ids is None else set(capability_ids)
        marked = []
        for record in await self._select(f"status IN ({_marks(len(_NON_TERMINAL))})", _NON_TERMINAL):
            if wanted is not None and record.capability_id not in wanted:
                continue
            metadata = {**record.metadata, "status": Status.FAILED.value}
            metadata["error_code"] = INTERRUPTED_BY_RESTART
            if "cleanup" in metadata:
                # CONTRACT §6.7: a restart ends every claim (the old process's sessions went with it).
                metadata["cleanup"] = {"state": "confirmed", "claim": "released"}
            metadata.pop("retry_after_seconds", None)
            # CONTRACT §6.7: a restart ends every claim; the old sessions died with it
            if "scope" in metadata:
                metadata["cleanup"] = {"state": "confirmed", "claim": "released"}
            marked.append(
                await self.record_status(
                    record.operation_id,
                    status=Status.FAILED.value,
                    metadata=metadata,
                    now=now,
                    retry_after_seconds=None,
                    next_poll_at=None,
                    last_error=INTERRUPTED_BY_RESTART,
                    notify=False,
                )
            )
        return marked

    async def purge_terminal_before(self, cutoff: datetime) -> int:
        """Erase terminal operations last updated before `cutoff`, with history and continuation."""
        where = f"status IN ({_marks(len(_TERMINAL))}) AND updated_at < ?"
        params = (*_TERMINAL, to_ms(cutoff))
        async with self._writing():
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                for table in ("status_history", "continuations"):
                    await self._db.execute(
                        f"DELETE FROM {table} WHERE operation_id IN (SELECT operation_id FROM operations "
                        f"WHERE {where})",
                        params,
                    )
                cursor = await self._db.execute(f"DELETE FROM operations WHERE {where}", params)
                count = cursor.rowcount
                await cursor.close()
                await self._db.execute("COMMIT")
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
            if count:
                await self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return count

    # ---- continuations -------------------------------------------------------------------------------------

    async def put_continuation(self, operation_id: str, continuation: Mapping[str, Any]) -> str:
        """Store the raw continuation (separate table, never listed); its digest goes on the row."""
        digest = hashlib.sha256(canonical(continuation)).hexdigest()
        async with self._writing():
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                cursor = await self._db.execute(
                    "UPDATE operations SET continuation_digest = ? WHERE operation_id = ?",
                    (digest, operation_id),
                )
                found = cursor.rowcount == 1
                await cursor.close()
                if found:
                    await self._db.execute(
                        "INSERT INTO continuations (operation_id, body, claimed_at) VALUES (?, ?, NULL) "
                        "ON CONFLICT (operation_id) DO UPDATE SET body = excluded.body "
                        "WHERE continuations.claimed_at IS NULL",
                        (operation_id, _json(continuation)),
                    )
                await self._db.execute("COMMIT")
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
        if not found:
            raise RegistryError("no such operation", code=Code.UNKNOWN_OPERATION)
        return digest

    async def claim_resume(self, operation_id: str) -> Mapping[str, Any] | None:
        """The stored continuation, exactly once across callers and restarts (its body is dropped)."""
        select = "SELECT body FROM continuations WHERE operation_id = ? AND claimed_at IS NULL"
        claim = "UPDATE continuations SET claimed_at = ?, body = NULL WHERE operation_id = ?"
        async with self._writing():
            # IMMEDIATE takes the write lock first: another connection's claim waits, then finds it taken.
            await self._db.execute("BEGIN IMMEDIATE")
            try:
                rows = await self._db.execute_fetchall(select, (operation_id,))
                body = next(iter(rows), (None,))[0]
                if body is not None:
                    await self._db.execute(claim, (to_ms(wall_clock()), operation_id))
                await self._db.execute("COMMIT")
            except BaseException:
                await self._db.execute("ROLLBACK")
                raise
        if body is None:
            return None
        continuation: dict[str, Any] = json.loads(body)
        return continuation

    async def unclaimed_continuations(self) -> builtins.list[str]:
        """Ids of terminal operations whose continuation was never claimed (resume after a restart)."""
        sql = (
            "SELECT c.operation_id FROM continuations c JOIN operations o USING (operation_id) "
            f"WHERE c.claimed_at IS NULL AND o.status IN ({_marks(len(_TERMINAL))}) ORDER BY o.updated_at"
        )
        rows = await self._db.execute_fetchall(sql, _TERMINAL)
        return [row[0] for row in rows]

    # ---- listeners -----------------------------------------------------------------------------------------

    def add_terminal_listener(self, callback: TerminalListener) -> Callable[[], None]:
        """Call `callback(record)` once per operation when it turns terminal; returns an undo function."""
        self._listeners.append(callback)

        def undo() -> None:
            if callback in self._listeners:
                self._listeners.remove(callback)

        return undo

    async def _fire(self, record: OperationRecord) -> None:
        for listener in list(self._listeners):
            try:
                outcome = listener(record)
                if outcome is not None:
                    await outcome
            except Exception as error:  # one broken listener must not hide the change from the others
                _log.error("terminal listener failed with %s", type(error).__name__)

    # ---- reads ---------------------------------------------------------------------------------------------

    async def get(self, operation_id: str) -> OperationRecord | None:
        """The record of one operation, or None."""
        found = await self._select("operation_id = ?", (operation_id,))
        return found[0] if found else None

    async def find_by_bus_op(self, owner: str, bus_op: str) -> OperationRecord | None:
        """The operation `owner` started on the Bus with the caller-chosen `bus_op`."""
        found = await self._select("owner = ? AND bus_op = ?", (owner, bus_op))
        return found[0] if found else None

    async def find_for(self, owner: str, op: str) -> OperationRecord | None:
        """The row `owner` started under the Bus handle `op`, else the row whose operation id is `op`."""
        record = await self.find_by_bus_op(owner, op)
        return record if record is not None else await self.get(op)

    def open_reader(self) -> RegistryReader | None:
        """A read-only synchronous reader of this registry's file (None: read through this API instead)."""
        return RegistryReader.open(self.path)

    async def list(self, *, status: str | None = None, limit: int = 200) -> builtins.list[OperationRecord]:
        """Operations, most recently updated first, optionally of one status."""
        if status is None:
            return await self._select("1", (), order="updated_at DESC, operation_id", limit=limit)
        wanted = Status(status).value
        return await self._select("status = ?", (wanted,), order="updated_at DESC, operation_id", limit=limit)

    async def newest(
        self, *, status: str | None = None, before: tuple[datetime, str] | None = None, limit: int = 200
    ) -> builtins.list[OperationRecord]:
        """Operations newest first by (created_at, operation_id), strictly before `before` if given."""
        where: list[str] = ["1"]
        params: list[Any] = []
        if status is not None:
            where.append("status = ?")
            params.append(Status(status).value)
        if before is not None:
            at = to_ms(before[0])
            where.append("(created_at < ? OR (created_at = ? AND operation_id < ?))")
            params += [at, at, before[1]]
        order = "created_at DESC, operation_id DESC"
        return await self._select(" AND ".join(where), tuple(params), order=order, limit=limit)

    async def known_ids(self) -> set[str]:
        """The ids of every operation the registry holds."""
        rows = await self._db.execute_fetchall("SELECT operation_id FROM operations")
        return {row[0] for row in rows}

    async def history(self, operation_id: str) -> builtins.list[HistoryEvent]:
        """The digest-only status history of one operation, oldest first."""
        sql = "SELECT seq, at, status, digest FROM status_history WHERE operation_id = ? ORDER BY seq"
        rows = await self._db.execute_fetchall(sql, (operation_id,))
        return [HistoryEvent(row[0], from_ms(row[1]), row[2], row[3]) for row in rows]

    async def due(self, now: datetime, limit: int = 1000) -> builtins.list[OperationRecord]:
        """Non-terminal operations whose next poll is due, earliest first."""
        where = "next_poll_at IS NOT NULL AND next_poll_at <= ?"
        return await self._select(where, (to_ms(now),), order="next_poll_at, operation_id", limit=limit)

    async def next_due_at(self) -> datetime | None:
        """When the earliest poll is due (None when nothing is waiting)."""
        rows = await self._db.execute_fetchall("SELECT min(next_poll_at) FROM operations")
        value = next(iter(rows), (None,))[0]
        return None if value is None else from_ms(value)

    async def count_active(self) -> int:
        """How many operations are not terminal."""
        sql = f"SELECT count(*) FROM operations WHERE status IN ({_marks(len(_NON_TERMINAL))})"
        rows = await self._db.execute_fetchall(sql, _NON_TERMINAL)
        return int(next(iter(rows), (0,))[0])

    async def _select(
        self, where: str, params: tuple[Any, ...], *, order: str = "created_at", limit: int | None = None
    ) -> builtins.list[OperationRecord]:
        sql = f"SELECT {_COLUMNS} FROM operations WHERE {where} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {max(0, int(limit))}"
        rows = await self._db.execute_fetchall(sql, params)
        records = []
        for row in rows:
            fixed = _Fixed.from_row(tuple(row))
            self._remember(fixed)
            records.append(fixed.record(tuple(row)[_FIXED_COUNT:-1], row[-1]))
        return records

    # ---- set-up --------------------------------------------------------------------------------------------
