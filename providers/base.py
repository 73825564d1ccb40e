"""The provider seam: one small interface per transport, shaped like bleak's backends.

A provider starts one session per admitted scope and pushes observations into a sink. `stop()` is
idempotent and returns only once the backend acknowledged that *this* session ended; it raises
`StopUnconfirmed` when the backend refused. The runtime bounds it with the profile's cleanup timeout.
Driver errors are translated here, at the edge, into `connector.errors.ProviderError` subclasses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from connector.core.observations import Observation, Transport
from connector.core.scope import DiscoveryScope
from connector.errors import ProviderError


@dataclass(frozen=True, slots=True)
class ProviderCapabilities:
    """What a backend declares about itself."""

    transport: Transport
    # Scope filter keys the backend applies on its side (the provider still re-filters everything).
    backend_filters: frozenset[str] = frozenset()
    # True when several sessions may share one adapter at once (no exclusive claim needed).
    concurrent_sessions: bool = False


class ObservationSink(Protocol):
    """Where a provider session delivers what it saw; called on the event loop thread."""

    def observe(self, observation: Observation) -> None:
        """One in-scope observation (the provider already filtered it)."""

    def fail(self, error: ProviderError) -> None:
        """The backend failed or restarted mid-session."""


class ProviderSession(Protocol):
    """One running backend session."""

    async def stop(self) -> None:
        """Stop this session; return only after the backend acknowledged. Idempotent."""


class Provider(Protocol):
    """A transport's scanner."""

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities."""

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ProviderSession:
        """Start a session for `scope`; raise `ProviderError` when it cannot start."""
