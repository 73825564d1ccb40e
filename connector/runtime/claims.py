"""Transport claims (CONTRACT §6.7), keyed by (transport, resolved adapter).

A claim is taken before the provider is started and released only once cleanup is confirmed (an
acknowledged stop or a qualified proof); an uncertain cleanup keeps it held, and blocking, until the
background retry confirms it. The adapter is the resolved one: a scan naming none is keyed by the adapter
the provider would choose (`Provider.resolve_adapter`, when it has one), else by `default`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from connector.contract.transports import Transport
from connector.errors import AdmissionError, Code

DEFAULT_ADAPTER = "default"


@dataclass(frozen=True, slots=True)
class ClaimKey:
    """What a claim covers: a transport on one adapter."""

    transport: Transport
    adapter: str


@dataclass(frozen=True, slots=True)
class Claim:
    """A held claim; `exclusive` is False for backends that declared concurrent sessions."""

    key: ClaimKey
    operation_id: str
    exclusive: bool


def claim_key(transport: Transport, adapter: str | None) -> ClaimKey:
    """The key of a scan on `adapter` (or the transport's default adapter)."""
    return ClaimKey(transport=transport, adapter=adapter or DEFAULT_ADAPTER)


class ClaimRegistry:
    """The claims of one connector process (event-loop thread only).

    An exclusive claim blocks every other exclusive session on its key. Shared claims (backends that
    declared concurrent sessions) block nothing while healthy. Any claim whose cleanup became uncertain
    blocks every new session on its key until it is released (CONTRACT §6.7).
    """

    def __init__(self) -> None:
        # Blocking holders per key -> when each is expected to release (window end + cleanup; Retry-After).
        self._blocking: dict[ClaimKey, dict[str, int]] = {}
        # Of those, the ones blocking because their cleanup is uncertain (they block shared sessions too).
        self._uncertain: dict[ClaimKey, set[str]] = {}
        self._shared: dict[ClaimKey, set[str]] = {}

    def acquire(
        self,
        key: ClaimKey,
        *,
        operation_id: str,
        concurrent: bool,
        now_ms: int,
        expected_release_ms: int,
    ) -> Claim:
        """Take the claim, or refuse with `transport-claimed` and a Retry-After while a holder blocks it."""
        if self._uncertain.get(key) or (not concurrent and self._blocking.get(key)):
            raise AdmissionError(
                "the transport is claimed by another scan",
                code=Code.TRANSPORT_CLAIMED,
                retry_after_seconds=self.retry_after_seconds(key, now_ms),
            )
        if concurrent:
            self._shared.setdefault(key, set()).add(operation_id)
            return Claim(key=key, operation_id=operation_id, exclusive=False)
        self._blocking[key] = {operation_id: expected_release_ms}
        return Claim(key=key, operation_id=operation_id, exclusive=True)

    def release(self, claim: Claim) -> None:
        """Release a claim after a confirmed cleanup (idempotent; never releases another holder's)."""
        blocking = self._blocking.get(claim.key, {})
        blocking.pop(claim.operation_id, None)
        if not blocking:
            self._blocking.pop(claim.key, None)
        for index in (self._uncertain, self._shared):
            members = index.get(claim.key, set())
            members.discard(claim.operation_id)
            if not members:
                index.pop(claim.key, None)

    def postpone(self, claim: Claim, expected_release_ms: int) -> None:
        """Cleanup became uncertain: the claim now blocks its key, expected to release at the given time."""
        if not self._held(claim):
            return
        self._blocking.setdefault(claim.key, {})[claim.operation_id] = expected_release_ms
        self._uncertain.setdefault(claim.key, set()).add(claim.operation_id)

    def holder(self, key: ClaimKey) -> str | None:
        """The first operation that blocks `key` (exclusive, or shared with uncertain cleanup), if any."""
        return next(iter(self._blocking.get(key, {})), None)

    def _held(self, claim: Claim) -> bool:
        """True while this claim is still held by its operation."""
        if claim.operation_id in self._blocking.get(claim.key, {}):
            return True
        return not claim.exclusive and claim.operation_id in self._shared.get(claim.key, set())

    def retry_after_seconds(self, key: ClaimKey, now_ms: int) -> int:
        """Whole seconds until the blocking holders are expected to let go (at least 1)."""
        remaining_ms = max(self._blocking.get(key, {}).values(), default=now_ms) - now_ms
        return max(1, math.ceil(remaining_ms / 1000))
