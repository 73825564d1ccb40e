"""A recording, gated stand-in for a store's aiosqlite connection: what each commit held, and when."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import anyio

from connector.storage.sqlite import SqliteStore


class CommitGate:
    """Wraps `store`'s connection: a commit waits while the gate is held; each committed group is recorded.

    `groups` lists, per commit that returned, the first parameter (the row's id) of every statement in it.
    """

    def __init__(self, store: SqliteStore) -> None:
        self._real = store._db
        self._store = store
        store._db = self  # type: ignore[assignment]
        self._open = anyio.Event()
        self._open.set()
        self._statements: list[Any] = []
        self.groups: list[list[Any]] = []
        self.held_commits = 0
        self.attempts = 0  # commits that came through the gate
        self.failing: set[int] = set()  # which of them (1-based) fail instead

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def hold(self) -> None:
        """From now on a COMMIT waits for `release()`."""
        self._open = anyio.Event()

    def release(self) -> None:
        """Let waiting and later commits through."""
        self._open.set()

    def execute(self, sql: str, parameters: Any = None) -> Any:
        """The real `execute`, except that a commit (a group's COMMIT, or a lone statement outside a
        transaction) is gated, recorded, or made to fail."""
        if sql == "COMMIT":  # a group's statements ran in one job of the thread (`_begin_group`)
            self._statements = [write.params[0] for write in self._store.committing]
            return self._commit(self._real.execute(sql))
        if parameters is not None:
            if not self._real.in_transaction:  # autocommit: the statement is its own commit
                self._statements = [parameters[0]]
                return self._commit(self._real.execute(sql, parameters))
            self._statements.append(parameters[0])
        return self._real.execute(sql) if parameters is None else self._real.execute(sql, parameters)

    async def _commit(self, statement: Awaitable[Any]) -> Any:
        self.held_commits += 1
        try:
            await self._open.wait()
        finally:
            self.held_commits -= 1
        self.attempts += 1
        if self.attempts in self.failing:
            statement.close()  # type: ignore[attr-defined]
            raise OSError("disk I/O error (injected)")
        cursor = await statement
        self.groups.append(self._statements)
        return cursor
