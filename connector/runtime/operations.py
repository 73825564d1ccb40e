"""One protocol over the runtimes of both operation kinds: callers look a kind up instead of branching.

`DiscoveryManager` (scans, held in memory) and `CommandRunner` (commands, kept in the connector state)
implement it natively. Each owns its operation's durable row, insert and update, through its journal. An id
a runtime does not hold answers None, in both runtimes, so that the caller decides what an unknown id means
(a durable record, `unknown-operation`, or the host's `unknown`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from connector.contract.catalog_models import ActionClass

Kind = ActionClass  # an operation's kind is the class of its catalog action

Admission_contra = TypeVar("Admission_contra", contravariant=True)
Answer_co = TypeVar("Answer_co", covariant=True)


@dataclass(frozen=True, slots=True)
class Observed:
    """One look that discloses nothing: status, durable metadata (and a command's full status and hint)."""

    status: str
    metadata: Mapping[str, Any]
    retry_hint: int | None = None
    document: Mapping[str, Any] | None = None


class Operations(Protocol[Admission_contra, Answer_co]):
    """What the service asks of the runtime of one operation kind; None for an id it does not hold."""

    @property
    def kind(self) -> Kind:
        """The operation kind this runtime runs."""

    @property
    def bindable(self) -> bool:
        """Whether its operations have candidates a caller may select and bind."""

    async def admit(self, admission: Admission_contra) -> Answer_co:
        """Record the admitted operation durably, then start its work."""

    async def status(
        self, operation_id: str, *, after: int | None = None, wait_s: float = 0.0
    ) -> dict[str, Any] | None:
        """The caller-private status; with `wait_s`, once it changed past `after` (or ended) or after that."""

    async def cancel(self, operation_id: str) -> tuple[bool, dict[str, Any]] | None:
        """Request cancellation: whether the request changed anything, and the status after it."""

    async def stop(self, operation_id: str, error_code: str) -> None:
        """End the work because its host ended the operation (expiry, response too large)."""

    async def observe(self, operation_id: str) -> Observed | None:
        """Status and durable metadata, never candidates."""
