"""Transport claims (SPEC 6.7): one exclusive scan per (transport, adapter) unless the backend shares.

A claim is taken before the provider is started and released only when a stop was acknowledged; an
uncertain cleanup keeps it held until the background retry sees a late acknowledgement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from connector.core.observations import Transport
from connector.errors import AdmissionError

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
    """The held exclusive claims of one connector process (event-loop thread only)."""

    def __init__(self) -> None:
        self._holders: dict[ClaimKey, str] = {}
        # When the holder is expected to release (window end + cleanup budget); drives Retry-After.
        self._expected_release_ms: dict[ClaimKey, int] = {}

    def acquire(
        self,
        key: ClaimKey,
        *,
        operation_id: str,
        concurrent: bool,
        now_ms: int,
        expected_release_ms: int,
    ) -> Claim:
        """Take the claim, or refuse with `transport-claimed` and a Retry-After; shared backends skip it."""
        if concurrent:
            return Claim(key=key, operation_id=operation_id, exclusive=False)
        if key in self._holders:
            raise AdmissionError(
                "the transport is claimed by another scan",
                code="transport-claimed",
                retry_after_seconds=self.retry_after_seconds(key, now_ms),
            )
        self._holders[key] = operation_id
        self._expected_release_ms[key] = expected_release_ms
        return Claim(key=key, operation_id=operation_id, exclusive=True)

    def release(self, claim: Claim) -> None:
        """Release a claim after an acknowledged stop (idempotent; never releases another holder's)."""
        if claim.exclusive and self._holders.get(claim.key) == claim.operation_id:
            del self._holders[claim.key]
            del self._expected_release_ms[claim.key]

    def postpone(self, claim: Claim, expected_release_ms: int) -> None:
        """Move the expected release of a held claim (e.g. while cleanup is being retried)."""
        if claim.exclusive and self._holders.get(claim.key) == claim.operation_id:
            self._expected_release_ms[claim.key] = expected_release_ms

    def holder(self, key: ClaimKey) -> str | None:
        """The operation holding `key`, if any."""
        return self._holders.get(key)

    def is_held(self, claim: Claim) -> bool:
        """True while this exclusive claim is still held by its operation."""
        return claim.exclusive and self._holders.get(claim.key) == claim.operation_id

    def retry_after_seconds(self, key: ClaimKey, now_ms: int) -> int:
        """Whole seconds until the holder is expected to let go (at least 1)."""
        remaining_ms = self._expected_release_ms.get(key, now_ms) - now_ms
        return max(1, math.ceil(remaining_ms / 1000))
