"""How a discovery session ends (CONTRACT §6.2, 6.7) as data: causes, their precedence, and one pure
conclusion.

Rules of this file:
- a session ends for one `EndCause`; `OVERRIDES` says which later cause replaces which earlier one (until
  the terminal status is reported): a caller's cancel replaces any cause but a revocation/shutdown, a
  revocation/shutdown replaces any cause but a cancel, every other cause only ever comes first;
- `due_cause` picks the time-driven cause (earliest passed deadline, window first on a tie);
- `conclude(cause, code, stop)` is the only place that maps an end to its terminal status, error code,
  cancellation and cleanup state and diagnostics; the claim is derived from cleanup, never stored beside it;
- `mermaid()` draws the sub-machine from the same data; `tests/core/test_endings.py` checks the
  copy in docs/ARCHITECTURE.md.
- Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from types import MappingProxyType

from connector.core.lifecycle import Status
from connector.errors import Code

DEADLINE_EXCEEDED = Code.DEADLINE_EXCEEDED
CLEANUP_UNCONFIRMED = Code.CLEANUP_UNCONFIRMED
CANCELLATION_UNCONFIRMED = Code.CANCELLATION_UNCONFIRMED
PROVIDER_FAILURE = Code.PROVIDER_FAILURE
PROVIDER_RESTARTED = Code.PROVIDER_RESTARTED
STOP_BY_DISCONNECT = Code.STOP_BY_DISCONNECT


class EndCause(StrEnum):
    """Why a session ends."""

    WINDOW = "window-complete"
    DEADLINE = "deadline-reached"
    LIMIT = "limit-reached"
    FAILURE = Code.PROVIDER_FAILURE
    CANCEL = "cancel"
    TIMEOUT = "timed-out"
    EXPIRY = "expired"
    TERMINATE = "terminate"


class StopResult(StrEnum):
    """What the bounded stop of the provider session gave."""

    ACKNOWLEDGED = "acknowledged"
    PROVEN = "proven"
    UNCERTAIN = "uncertain"


class CancellationState(StrEnum):
    """`cancellation.state` on the wire."""

    REQUESTED = "requested"
    CONFIRMED = "confirmed"
    UNCERTAIN = "uncertain"


class CleanupState(StrEnum):
    """`cleanup.state` on the wire."""

    PENDING = "pending"
    CONFIRMED = "confirmed"
    UNCERTAIN = "uncertain"


class ClaimState(StrEnum):
    """`cleanup.claim` on the wire."""

    HELD = "held"
    RELEASED = "released"


COMPLETING: frozenset[EndCause] = frozenset({EndCause.WINDOW, EndCause.DEADLINE, EndCause.LIMIT})
_ORDINARY = COMPLETING | {EndCause.FAILURE, EndCause.TIMEOUT, EndCause.EXPIRY}

# new cause -> the causes it replaces when it comes later.
OVERRIDES: Mapping[EndCause, frozenset[EndCause]] = MappingProxyType(
    {
        EndCause.CANCEL: _ORDINARY,
        EndCause.TERMINATE: _ORDINARY,
        **{cause: frozenset[EndCause]() for cause in _ORDINARY},
    }
)


def wins(new: EndCause, current: EndCause | None) -> bool:
    """True when `new` becomes the end cause given the `current` one."""
    return current is None or current in OVERRIDES[new]


def due_cause(
    now_ms: int,
    *,
    window_end_ms: int,
    cut_by_deadline: bool,
    timeout_at_ms: int | None,
    expires_at_ms: int | None,
) -> EndCause | None:
    """The earliest passed time-driven end (the window first on a tie), or None."""
    window = EndCause.DEADLINE if cut_by_deadline else EndCause.WINDOW
    candidates = [
        (window_end_ms, 0, window),
        (timeout_at_ms, 1, EndCause.TIMEOUT),
        (expires_at_ms, 2, EndCause.EXPIRY),
    ]
    passed = [(at, rank, cause) for at, rank, cause in candidates if at is not None and now_ms >= at]
    return min(passed)[2] if passed else None


def cleanup_of(stop: StopResult) -> CleanupState:
    """An acknowledgement or a qualified proof confirms cleanup; anything else leaves it uncertain."""
    return CleanupState.UNCERTAIN if stop is StopResult.UNCERTAIN else CleanupState.CONFIRMED


def claim_of(cleanup: CleanupState) -> ClaimState:
    """The claim is released exactly when cleanup is confirmed."""
    return ClaimState.RELEASED if cleanup is CleanupState.CONFIRMED else ClaimState.HELD


@dataclass(frozen=True, slots=True)
class Ending:
    """The terminal facts of one session."""

    status: Status
    error_code: str | None
    reason: str | None
    cancellation: CancellationState | None
    cleanup: CleanupState
    diagnostics: tuple[str, ...] = ()

    @property
    def claim(self) -> ClaimState:
        """Derived from cleanup."""
        return claim_of(self.cleanup)

    @property
    def keeps_result(self) -> bool:
        """Only a completed session keeps its candidates (as the result)."""
        return self.status is Status.COMPLETED


def _diagnostics(stop: StopResult) -> tuple[str, ...]:
    return (STOP_BY_DISCONNECT,) if stop is StopResult.PROVEN else ()


def conclude(cause: EndCause, code: str | None, stop: StopResult) -> Ending:
    """The terminal status, error code, cancellation and cleanup of a session that ended for `cause`."""
    cleanup = cleanup_of(stop)
    confirmed = cleanup is CleanupState.CONFIRMED
    diagnostics = _diagnostics(stop)
    if cause is EndCause.CANCEL:
        if confirmed:
            return Ending(Status.CANCELLED, None, None, CancellationState.CONFIRMED, cleanup, diagnostics)
        return Ending(Status.FAILED, CANCELLATION_UNCONFIRMED, None, CancellationState.UNCERTAIN, cleanup)
    if cause in COMPLETING and confirmed:
        return Ending(Status.COMPLETED, None, cause.value, None, cleanup, diagnostics)
    if cause is EndCause.TIMEOUT:
        return Ending(Status.TIMED_OUT, DEADLINE_EXCEEDED, None, None, cleanup, diagnostics)
    if cause is EndCause.EXPIRY:
        return Ending(Status.EXPIRED, DEADLINE_EXCEEDED, None, None, cleanup, diagnostics)
    error = (code or PROVIDER_FAILURE) if confirmed else CLEANUP_UNCONFIRMED
    return Ending(Status.FAILED, error, None, None, cleanup, diagnostics)


def confirmed_late(ending: Ending, stop: StopResult) -> Ending:
    """A background retry confirmed cleanup after the terminal status: only cleanup (and claim) move."""
    if stop is StopResult.UNCERTAIN:
        return ending
    diagnostics = ending.diagnostics + tuple(d for d in _diagnostics(stop) if d not in ending.diagnostics)
    return replace(ending, cleanup=CleanupState.CONFIRMED, diagnostics=diagnostics)


def _cause_node(cause: EndCause) -> str:
    return "cause_" + cause.value.replace("-", "_")


def _status_node(status: Status) -> str:
    return "status_" + status.value.replace("-", "_")


def mermaid() -> str:
    """The endings sub-machine as a Mermaid flowchart, drawn from `OVERRIDES` and `conclude`."""
    lines = ["flowchart LR"]
    for cause in EndCause:
        lines.append(f'    {_cause_node(cause)}(["{cause.value}"])')
    for status in sorted({conclude(c, None, s).status for c in EndCause for s in StopResult}):
        lines.append(f'    {_status_node(status)}["{status.value}"]')
    for new, replaced in OVERRIDES.items():
        for old in sorted(replaced):
            lines.append(f"    {_cause_node(old)} -. replaced by .-> {_cause_node(new)}")
    for cause in EndCause:
        code = "(code)" if cause in (EndCause.FAILURE, EndCause.TERMINATE) else None
        for stop in StopResult:
            ending = conclude(cause, code, stop)
            facts = [stop.value, f"cleanup {ending.cleanup.value}", f"claim {ending.claim.value}"]
            facts += [ending.error_code] if ending.error_code else []
            facts += list(ending.diagnostics)
            lines.append(
                f'    {_cause_node(cause)} -- "{", ".join(facts)}" --> {_status_node(ending.status)}'
            )
    return "\n".join(lines) + "\n"
