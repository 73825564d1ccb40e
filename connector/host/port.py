"""The host's view of the connector it polls: a small port, and its in-process implementation.

The host reaches the connector's work directly (same process) rather than through the connector's HTTP
routes, so that it can tell "the connector does not know this operation" (None) from "this principal may not
see it" (the host checks authority itself, against its own registry row).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from connector.core import authority
from connector.core.admission import Identified
from connector.core.policy import retry_after
from connector.runtime.operations import Kind, Observed
from connector.service.answers import Accepted, Done
from connector.service.connector import ConnectorService


@dataclass(frozen=True, slots=True)
class ActionInfo:
    """What the host needs to know of a catalog action."""

    action_id: str
    kind: Kind
    retry_after_seconds: int
    preferred_max_ttl_seconds: int | None


class ConnectorPort(Protocol):
    """What the host asks of the connector that owns the work."""

    def authenticate(self, token: str | None) -> authority.Principal:
        """The principal behind a bearer token (`unauthenticated` otherwise)."""

    def action(self, action_id: str) -> ActionInfo | None:
        """The catalog action, or None when the catalog no longer has it."""

    def identify(
        self, principal: authority.Principal, directive: Any, *, op_key: str | None, operations_only: bool
    ) -> Identified:
        """Admission steps 2-3 and the keyed id (an edge looks the operation up before admitting it)."""

    async def admit(
        self,
        principal: authority.Principal,
        directive: Any,
        *,
        op_key: str | None,
        identified: Identified | None = None,
    ) -> Accepted | Done:
        """The connector's admission (CONTRACT §2) for an authenticated principal."""

    async def observe(self, operation_id: str, kind: Kind) -> Observed | None:
        """Status and durable metadata, never candidates; None when the connector does not know the id."""

    async def caller_status(
        self, operation_id: str, kind: Kind, *, wait_seconds: float | None, after_revision: int | None
    ) -> dict[str, Any] | None:
        """The caller-private status (v2 with the snapshot for discovery); None when unknown."""

    async def cancel(self, operation_id: str, kind: Kind) -> tuple[bool, dict[str, Any]] | None:
        """Request cancellation: whether it changed anything, and the caller-private status after it (None
        when unknown)."""

    async def stop(self, operation_id: str, kind: Kind, error_code: str) -> None:
        """End the work because the host ended the operation (expiry, response too large)."""


class InProcessConnector:
    """`ConnectorPort` over a `ConnectorService` living in the same process."""

    def __init__(self, service: ConnectorService) -> None:
        self.service = service

    def authenticate(self, token: str | None) -> authority.Principal:
        """The principal behind a bearer token, after picking up a changed principals file."""
        return self.service.authenticate(token)

    def action(self, action_id: str) -> ActionInfo | None:
        """The catalog action's class and deferred hints."""
        action = self.service.catalog.actions.get(action_id)
        if action is None:
            return None
        profile = action.deferred_profile
        return ActionInfo(
            action_id=action_id,
            kind=action.action_class,
            retry_after_seconds=retry_after(profile),
            preferred_max_ttl_seconds=profile.preferred_max_ttl_seconds if profile else None,
        )

    def identify(
        self, principal: authority.Principal, directive: Any, *, op_key: str | None, operations_only: bool
    ) -> Identified:
        """Admission steps 2-3 and the keyed id, run once for the admission that may follow."""
        return self.service.identify(principal, directive, op_key=op_key, operations_only=operations_only)

    async def admit(
        self,
        principal: authority.Principal,
        directive: Any,
        *,
        op_key: str | None,
        identified: Identified | None = None,
    ) -> Accepted | Done:
        """Admission in CONTRACT §2 order; `op_key` (a Bus `op`) overrides the idempotency key."""
        return await self.service.invoke(principal, directive, op_key=op_key, identified=identified)

    async def observe(self, operation_id: str, kind: Kind) -> Observed | None:
        """Durable metadata: the CONTRACT §7 projection for discovery, the status without result for
        commands."""
        return await self.service.observe(operation_id, kind)

    async def caller_status(
        self, operation_id: str, kind: Kind, *, wait_seconds: float | None, after_revision: int | None
    ) -> dict[str, Any] | None:
        """What the owning caller reads (every candidate in it counts as disclosed)."""
        return await self.service.poll(
            operation_id, kind, wait_seconds=wait_seconds, after_revision=after_revision
        )

    async def cancel(self, operation_id: str, kind: Kind) -> tuple[bool, dict[str, Any]] | None:
        """Discovery: the cancel is recorded and the stop begins; commands: waits for the confirmed end."""
        return await self.service.request_cancel(operation_id, kind)

    async def stop(self, operation_id: str, kind: Kind, error_code: str) -> None:
        """Discovery: terminate the session (cleanup per CONTRACT §6.7); commands: cancel cancelable work."""
        await self.service.stop(operation_id, kind, error_code)
