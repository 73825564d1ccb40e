"""A recording, gated stand-in for a store's transactions: what each commit held, and when."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio

from connector.storage.sqlite import SqliteStore


class CommitGate:
    """Wraps `store`'s transactions: a commit waits while the gate is held; each committed group is recorded.

    `groups` lists, per commit that returned, the first parameter (the row's id) of every statement in it.
    """

    def __init__(self, store: SqliteStore) -> None:
        self._real = store._run_transaction
        store._run_transaction = self._run  # type: ignore[method-assign]
        self._open = anyio.Event()
        self._open.set()
        self.groups: list[list[Any]] = []
        self.held_commits = 0
        self.attempts = 0  # commits that came through the gate
        self.failing: set[int] = set()  # which of them (1-based) fail instead

    def hold(self) -> None:
        """From now on a commit waits for `release()`."""
        self._open = anyio.Event()

    def release(self) -> None:
        """Let waiting and later commits through."""
        self._open.set()

    async def _run(self, batch: Sequence[Any]) -> None:
        """The real transaction (a group, or a lone statement in autocommit), gated, recorded, or failed."""
        self.held_commits += 1
        try:
            await self._open.wait()
        finally:
            self.held_commits -= 1
        self.attempts += 1
        if self.attempts in self.failing:
            raise OSError("disk I/O error (injected)")
        await self._real(batch)
        self.groups.append([write.params[0] for write in batch])
