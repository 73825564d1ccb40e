"""Host policy (CONTRACT §3): clamps for retry hints, operation lifetime, discovery windows and response size.

A connector or caller can only narrow what the policy alone gives. Pure: `now` and the jitter draw are
passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from connector.contract.canonical import canonical_bytes
from connector.contract.catalog_models import DeferredProfileModel
from connector.errors import Code, SensoriumError

# CONTRACT §1: the connector's retry hint when the action's deferred profile gives none.
DEFAULT_RETRY_AFTER_SECONDS = 1
# The longest long poll a caller may ask for: a larger `wait_seconds` waits this long.
MAX_WAIT_SECONDS = 30


class PolicyError(SensoriumError):
    """The host policy configuration was refused; diagnostics name the keys, never their values."""

    default_code = Code.INVALID_POLICY


_INT_MINIMUMS: Mapping[str, int] = {
    "min_retry_after_seconds": 0,
    "max_retry_after_seconds": 0,
    "max_ttl_seconds": 1,
    "max_attempts": 1,
    "max_response_bytes": 1,
    "max_operations_per_principal": 1,
    "max_live_sessions": 1,
}


@dataclass(frozen=True, slots=True)
class DeferredHostPolicy:
    """Host-side bounds for deferred operations; configurable, never by a caller or connector."""

    min_retry_after_seconds: int = 1
    max_retry_after_seconds: int = 60
    max_ttl_seconds: int = 900
    max_attempts: int = 1000
    max_response_bytes: int = 262144
    max_operations_per_principal: int = 16
    # All principals together, per transport: each real BLE session is a worker process (CONTRACT §3).
    max_live_sessions: int = 64
    jitter_fraction: float = 0.10

    def __post_init__(self) -> None:
        problems = [_problem(f.name, getattr(self, f.name)) for f in fields(self)]
        if not any(problems) and self.min_retry_after_seconds > self.max_retry_after_seconds:
            problems.append(("min-above-max", "/min_retry_after_seconds"))
        _raise_if_any([p for p in problems if p is not None])

    @classmethod
    def from_mapping(cls, config: Mapping[str, object]) -> DeferredHostPolicy:
        """Build a policy from configuration; unknown keys and nonsense values are refused."""
        known = {f.name for f in fields(cls)}
        _raise_if_any([("unknown-key", f"/{key}") for key in config if key not in known])
        # Type checks happen in __post_init__; the values are only forwarded here.
        return cls(**config)  # type: ignore[arg-type]

    def effective_retry_after(self, connector_hint: int, jitter_unit: float) -> int:
        """Clamp the connector's hint to [min, max], then add up to `jitter_fraction` of it, capped at max."""
        # Jitter only adds: the host never polls sooner than the (clamped) hint asked.
        if not 0.0 <= jitter_unit < 1.0:
            raise ValueError("jitter_unit must be in [0, 1)")
        base = min(max(connector_hint, self.min_retry_after_seconds), self.max_retry_after_seconds)
        extra = math.floor(base * self.jitter_fraction * jitter_unit)
        return min(base + extra, self.max_retry_after_seconds)

    def effective_expires_at(
        self,
        now: datetime,
        *,
        connector_fail_after: int | None,
        preferred_max_ttl: int | None,
        caller_deadline: datetime | None,
    ) -> datetime:
        """`now + min(min_present(hints) or max_ttl, max_ttl)`, floored to the millisecond."""
        _require_aware(now)
        ttl = timedelta(seconds=self.max_ttl_seconds)
        for hint in _present_ttls(now, connector_fail_after, preferred_max_ttl, caller_deadline):
            ttl = min(ttl, hint)
        return _floor_ms(now + ttl)

    def status_fits(self, document: Mapping[str, Any]) -> bool:
        """True when a status may be sent: its canonical JSON (RFC 8785) is within `max_response_bytes`."""
        return len(canonical_bytes(dict(document))) <= self.max_response_bytes

    def attempts_exhausted(self, attempts: int) -> bool:
        """True when `attempts` polls used up `max_attempts` (the operation then ends `expired`)."""
        return attempts >= self.max_attempts

    def admits_another_operation(self, active_operations: int) -> bool:
        """True when a principal with this many live operations may start one more."""
        return active_operations < self.max_operations_per_principal

    def admits_another_session(self, live_sessions: int) -> bool:
        """True when a transport with this many live scan sessions (every principal's) may start one more."""
        return live_sessions < self.max_live_sessions


# CONTRACT §6.7: the qualified stop proof takes at most 1 s beyond cleanup_timeout_ms.
PROOF_BOUND_MS = 1000


def clamp_wait(wait_seconds: float | None) -> float:
    """A caller's `wait_seconds` as it is waited: 0 (no wait, also when absent) up to `MAX_WAIT_SECONDS`."""
    return 0.0 if wait_seconds is None else max(0.0, min(float(wait_seconds), MAX_WAIT_SECONDS))


def retry_after(deferred_profile: DeferredProfileModel | None) -> int:
    """The connector's retry hint for an action: its deferred profile's, else the default (a 0 stays 0)."""
    hint = None if deferred_profile is None else deferred_profile.retry_after_seconds
    return DEFAULT_RETRY_AFTER_SECONDS if hint is None else hint


def discovery_window_end(
    start: datetime,
    window_seconds: int,
    caller_deadline: datetime | None,
    cleanup_timeout_ms: int,
) -> tuple[datetime, bool]:
    """The window's end and whether the caller's deadline (less cleanup and proof budgets, CONTRACT §3) cut
    it."""
    _require_aware(start)
    if window_seconds < 0 or cleanup_timeout_ms < 0:
        raise ValueError("window_seconds and cleanup_timeout_ms must be >= 0")
    own_end = start + timedelta(seconds=window_seconds)
    if caller_deadline is None:
        return own_end, False
    _require_aware(caller_deadline)
    cut = caller_deadline - timedelta(milliseconds=cleanup_timeout_ms + PROOF_BOUND_MS)
    if cut >= own_end:
        return own_end, False
    return max(cut, start), True


def _present_ttls(
    now: datetime,
    connector_fail_after: int | None,
    preferred_max_ttl: int | None,
    caller_deadline: datetime | None,
) -> list[timedelta]:
    # A present zero stays zero: `or max_ttl` in CONTRACT §3 means "absent", never "falsy".
    ttls = [timedelta(seconds=max(s, 0)) for s in (connector_fail_after, preferred_max_ttl) if s is not None]
    if caller_deadline is not None:
        _require_aware(caller_deadline)
        ttls.append(max(caller_deadline - now, timedelta(0)))
    return ttls


def _floor_ms(moment: datetime) -> datetime:
    return moment.replace(microsecond=moment.microsecond - moment.microsecond % 1000)


def _require_aware(moment: datetime) -> None:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError("datetimes passed to the host policy must be timezone-aware")


def _problem(name: str, value: object) -> tuple[str, str] | None:
    path = f"/{name}"
    if name == "jitter_fraction":
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1
        return None if ok else ("out-of-range", path)
    if not isinstance(value, int) or isinstance(value, bool):
        return ("not-an-integer", path)
    return None if value >= _INT_MINIMUMS[name] else ("out-of-range", path)


def _raise_if_any(problems: list[tuple[str, str]]) -> None:
    if problems:
        diagnostics = [{"code": rule, "message": path} for rule, path in problems]
        raise PolicyError("host policy configuration refused", diagnostics=diagnostics)
