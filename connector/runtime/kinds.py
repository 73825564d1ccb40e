"""One interface over the runtimes of the two operation kinds: callers look a kind up instead of branching.

`DiscoveryManager` holds scans in memory; `CommandRunner` keeps command operations in the connector state.
The adapters below give both the same five questions, and answer None for an operation the runtime does not
hold, so that the caller decides what an unknown id means (a durable record, `unknown-operation`, or the
host's `unknown`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from connector.contract.catalog_models import ActionClass
from connector.core.lifecycle import Status, is_terminal
from connector.core.projections import command_metadata
from connector.errors import SensoriumError
from connector.runtime.commands import CommandRunner
from connector.runtime.manager import DiscoveryManager, UnknownOperation

Kind = ActionClass  # an operation's kind is the class of its catalog action


@dataclass(frozen=True, slots=True)
class Observed:
    """One look that discloses nothing: status, durable metadata (and a command's full status and hint)."""

    status: str
    metadata: Mapping[str, Any]
    retry_hint: int | None = None
    document: Mapping[str, Any] | None = None


class OperationRuntime(Protocol):
    """What the service, the host and the Bus ask of the runtime of one operation kind."""

    @property
    def kind(self) -> Kind:
        """The operation kind this runtime runs."""

    @property
    def bindable(self) -> bool:
        """Whether its operations have candidates a caller may select and bind."""

    async def status(self, operation_id: str) -> dict[str, Any] | None:
        """The caller-private status (a read: the edge that delivers it counts what is disclosed)."""

    async def wait(
        self, operation_id: str, after_revision: int | None, wait_s: float
    ) -> dict[str, Any] | None:
        """Long poll: the caller-private status once it changed (or ended), or after `wait_s`."""

    async def cancel(self, operation_id: str) -> dict[str, Any] | None:
        """Request cancellation; the caller-private status after the request."""

    async def stop(self, operation_id: str, error_code: str) -> None:
        """End the work because its host ended the operation (expiry, response too large)."""

    async def observe(self, operation_id: str) -> Observed | None:
        """Status and durable metadata, never candidates."""


class DiscoveryRuntime:
    """`OperationRuntime` over the discovery manager (scans it still holds in memory)."""

    kind: Kind = "discovery"
    bindable = True

    def __init__(self, manager: DiscoveryManager) -> None:
        self.manager = manager

    async def status(self, operation_id: str) -> dict[str, Any] | None:
        """The v2 status of a held scan."""
        try:
            return self.manager.status(operation_id)
        except UnknownOperation:
            return None

    async def wait(
        self, operation_id: str, after_revision: int | None, wait_s: float
    ) -> dict[str, Any] | None:
        """The v2 status past `after_revision`, or now when `wait_s` is 0."""
        try:
            if wait_s:
                return await self.manager.wait_for_change(operation_id, after_revision, wait_s)
            return self.manager.status(operation_id)
        except UnknownOperation:
            return None

    async def cancel(self, operation_id: str) -> dict[str, Any] | None:
        """The cancel is recorded and the stop begins (it does not wait for the confirmed end)."""
        try:
            return self.manager.cancel(operation_id)
        except UnknownOperation:
            return None

    async def stop(self, operation_id: str, error_code: str) -> None:
        """Terminate the session (cleanup per CONTRACT §6.7)."""
        try:
            self.manager.terminate(operation_id, error_code=error_code)
        except UnknownOperation:
            return

    async def observe(self, operation_id: str) -> Observed | None:
        """The CONTRACT §7 projection."""
        try:
            metadata = self.manager.metadata(operation_id)
        except UnknownOperation:
            return None
        return Observed(str(metadata["status"]), metadata)


class CommandRuntime:
    """`OperationRuntime` over the command runner (operations it has stored)."""

    kind: Kind = "command"
    bindable = False

    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner

    async def status(self, operation_id: str) -> dict[str, Any] | None:
        """The current deferred status."""
        return await _unless_unknown(self.runner.status(operation_id))

    async def wait(
        self, operation_id: str, after_revision: int | None, wait_s: float
    ) -> dict[str, Any] | None:
        """The status once terminal or after `wait_s` (a command has no revisions)."""
        return await _unless_unknown(self.runner.wait_status(operation_id, wait_s))

    async def cancel(self, operation_id: str) -> dict[str, Any] | None:
        """Waits for the confirmed end; a terminal operation answers its unchanged status."""
        return await _unless_unknown(self.runner.cancel(operation_id))

    async def stop(self, operation_id: str, error_code: str) -> None:
        """Cancel cancelable work that has not ended (the runner records its own ending)."""
        row = await self.runner.operation(operation_id)
        if row is not None and row.cancelable and not is_terminal(Status(row.status)):
            await self.runner.cancel(operation_id)

    async def observe(self, operation_id: str) -> Observed | None:
        """The status without its result, and the full status."""
        document = await self.status(operation_id)
        if document is None:
            return None
        hint = document.get("retry_after_seconds")
        return Observed(
            str(document["status"]),
            command_metadata(document),
            hint if isinstance(hint, int) else None,
            document,
        )


async def _unless_unknown(answer: Awaitable[dict[str, Any]]) -> dict[str, Any] | None:
    """The runner's answer, or None for an operation it has not stored (other refusals propagate)."""
    try:
        return await answer
    except SensoriumError as error:
        if error.code == "unknown-operation":
            return None
        raise


def operation_runtimes(
    discovery: DiscoveryManager, commands: CommandRunner
) -> dict[Kind, OperationRuntime]:
    """The runtime of each kind."""
    return {"discovery": DiscoveryRuntime(discovery), "command": CommandRuntime(commands)}
