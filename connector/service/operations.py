"""A small read-only query interface over the connector's OWN operations, for the operator console.

The console lists every operation the process knows (CONTRACT §11): the host registry's, and those admitted on
the connector routes (`POST /v1/directives`) that the host never recorded. This module answers the second
part with durable metadata only (CONTRACT §7): the discovery runtime's durable projection and the command
rows' status without `result`. It is a Protocol plus one implementation over the runtime (live sessions), the
durable scan records of `storage/state.py` (scans that left memory or ran before a restart) and the
command store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from connector.core.clock import format_time
from connector.core.projections import command_metadata
from connector.runtime.commands import status_document
from connector.runtime.manager import DiscoveryManager
from connector.storage.state import CommandOperation, ConnectorState


@dataclass(frozen=True, slots=True)
class UncertainCleanup:
    """One ended session whose stop is not confirmed: it holds its adapter's claim."""

    operation_id: str
    since_ms: int | None
    next_retry_ms: int | None


@dataclass(frozen=True, slots=True)
class AdapterClaim:
    """One (transport, adapter) claim as the operator sees it."""

    transport: str
    adapter: str
    sessions: int
    uncertain: tuple[UncertainCleanup, ...]

    @property
    def state(self) -> str:
        """`held` (an uncertain cleanup blocks it), `in use` or `free`."""
        if self.uncertain:
            return "held"
        return "in use" if self.sessions else "free"


class ConnectorOperations(Protocol):
    """Durable metadata of the connector's own operations, and its adapter claims."""

    async def operations(self) -> list[dict[str, Any]]:
        """Every operation the connector retains, as durable metadata."""

    async def operation(self, operation_id: str) -> dict[str, Any] | None:
        """One operation's durable metadata, or None."""

    def claims(self) -> list[AdapterClaim]:
        """Each (transport, adapter) claim the runtime knows, free ones included."""


class LiveConnectorOperations:
    """`ConnectorOperations` over the discovery runtime (memory) and the command store (SQLite)."""

    def __init__(
        self,
        discovery: DiscoveryManager,
        state: ConnectorState,
        *,
        known_adapters: Mapping[str, str] | None = None,
    ) -> None:
        self._discovery = discovery
        self._state = state
        # The adapters every page lists even while free: transport -> adapter (the default's name).
        self._known = dict(known_adapters or {})

    async def operations(self) -> list[dict[str, Any]]:
        """Live discovery metadata, then the durable scan records (ended or from earlier runs), then
        command rows; the console sorts and filters."""
        found = []
        live = set()
        for op_id in self._discovery.operation_ids():
            observed = await self._discovery.observe(op_id)
            if observed is not None:  # else forgotten between the two calls
                found.append(dict(observed.metadata))
                live.add(op_id)
        for record in await self._state.list_discoveries():
            if record.operation_id not in live:
                found.append(dict(record.metadata))
        for row in await self._state.list_operations():
            found.append(_command_metadata(row))
        return found

    async def operation(self, operation_id: str) -> dict[str, Any] | None:
        """Durable metadata of a discovery (live, else its record) or a command, or None."""
        observed = await self._discovery.observe(operation_id)
        if observed is not None:
            return dict(observed.metadata)
        record = await self._state.get_discovery(operation_id)
        if record is not None:
            return dict(record.metadata)
        row = await self._state.get_operation(operation_id)
        return None if row is None else _command_metadata(row)

    def claims(self) -> list[AdapterClaim]:
        """Sessions counted per (transport, adapter): live ones use it, uncertain cleanups hold it."""
        sessions: dict[tuple[str, str], int] = {key: 0 for key in self._known.items()}
        uncertain: dict[tuple[str, str], list[UncertainCleanup]] = {}
        for claim in self._discovery.sessions():
            key = (claim.transport, claim.adapter)
            sessions.setdefault(key, 0)
            if claim.cleanup_uncertain:
                uncertain.setdefault(key, []).append(
                    UncertainCleanup(claim.operation_id, claim.terminal_at_ms, claim.next_retry_ms)
                )
            elif claim.claim_held:
                sessions[key] += 1
        return [
            AdapterClaim(transport, adapter, count, tuple(uncertain.get((transport, adapter), ())))
            for (transport, adapter), count in sorted(sessions.items())
        ]


def _command_metadata(row: CommandOperation) -> dict[str, Any]:
    """A command row's durable metadata: its status without `result` or `causal/context`, plus owner,
    action and creation time (no input, no output)."""
    metadata = command_metadata(status_document(row))
    metadata.pop("causal/context", None)
    metadata.update(owner=row.owner, action_id=row.action_id, created_at=format_time(row.created_at))
    return metadata
