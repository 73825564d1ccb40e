"""One discovery session (CONTRACT §6.2, 6.4, 6.7) as a frozen state and a pure `step(state, event, now_ms)`.

Rules of this file:
- a status moves only through `lifecycle.next_status` (the table drives the move, it does not just check it);
- which end cause wins, and what each end gives, is `endings` (`wins`, `due_cause`, `conclude`);
  observations stop counting the moment a cause is set (`accepting`);
- `step` returns the new state and the effects the runner carries out, in order: it never does I/O, never
  reads a clock (`now_ms` is passed in) and never touches the candidate table (a `Cut` or `ERASE` effect
  asks the runner to, and the runner feeds back what the cut gave);
- EVERY end asks for a provider stop (`STOP_PROVIDER`) and reports the terminal status only on the
  `Stopped` event that follows it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from connector.core.admission import SessionSpec
from connector.core.endings import (
    COMPLETING,
    DEADLINE_EXCEEDED,
    PROVIDER_FAILURE,
    PROVIDER_RESTARTED,
    CancellationState,
    CleanupState,
    EndCause,
    Ending,
    StopResult,
    conclude,
    confirmed_late,
    due_cause,
    wins,
)
from connector.core.lifecycle import INITIAL_STATUS, Event, Status, event_for, is_terminal, next_status
from connector.core.snapshot import IngestOutcome

# A pending cut re-checked sooner than this would only spin: whole-second content cannot change faster.
MIN_WAKE_MS = 5


@dataclass(frozen=True, slots=True)
class SessionState:
    """Everything one session records; a new value at every change."""

    spec: SessionSpec
    updated_at_ms: int
    state_changed_at_ms: int
    status: Status = INITIAL_STATUS
    reason: str | None = None
    error_code: str | None = None
    error_detail: str | None = None
    cancellation: CancellationState | None = None
    cancellation_requested_at_ms: int | None = None
    cancellation_confirmed_at_ms: int | None = None
    cleanup: CleanupState = CleanupState.PENDING
    diagnostics: tuple[str, ...] = ()
    ending: Ending | None = None
    erased_at_ms: int | None = None
    terminal_at_ms: int | None = None
    final_revision: int = 0
    end_cause: EndCause | None = None
    end_code: str | None = None

    @property
    def is_terminal(self) -> bool:
        """True once the terminal status was reported."""
        return is_terminal(self.status)

    @property
    def accepting(self) -> bool:
        """True while observations still count: until an end cause is set."""
        return self.end_cause is None


def initial_state(spec: SessionSpec) -> SessionState:
    """A pending session, as admitted."""
    return SessionState(spec=spec, updated_at_ms=spec.created_at_ms, state_changed_at_ms=spec.created_at_ms)


# ---- events ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """The provider session started."""


@dataclass(frozen=True, slots=True)
class StartFailed:
    """The provider did not start: `cut` when the deadline cut the start off, `stop` what was left."""

    code: str | None = None
    detail: str | None = None
    cut: bool = False
    stop: StopResult = StopResult.ACKNOWLEDGED


@dataclass(frozen=True, slots=True)
class Observed:
    """What one observation did to the candidate table."""

    outcome: IngestOutcome


@dataclass(frozen=True, slots=True)
class ProviderFailed:
    """The backend failed or restarted mid-session."""

    code: str


@dataclass(frozen=True, slots=True)
class TimerDue:
    """The runner woke (a deadline, a pending cut, or an end request)."""


@dataclass(frozen=True, slots=True)
class CutMade:
    """What a cut the step asked for gave: a new revision, a bound reached."""

    revised: bool
    limit_reached: bool


@dataclass(frozen=True, slots=True)
class EndRequested:
    """An end cause from inside the runtime (the limit, a revocation without erase)."""

    cause: EndCause
    code: str | None = None


@dataclass(frozen=True, slots=True)
class CancelRequested:
    """A caller's cancel."""


@dataclass(frozen=True, slots=True)
class Terminate:
    """Revocation or shutdown: end `failed` with `code`; `erase` drops the candidates at once."""

    code: str
    erase: bool


@dataclass(frozen=True, slots=True)
class EraseResult:
    """Retention ended: the candidates go, the status keeps reason and final revision."""


@dataclass(frozen=True, slots=True)
class Finishing:
    """The runner saw the end cause: final cut or erase, then the stop."""


@dataclass(frozen=True, slots=True)
class InternalFailure:
    """A bug in the runner: end `failed` with the usual bounded stop."""


@dataclass(frozen=True, slots=True)
class Stopped:
    """The bounded provider stop ended with `stop`; `revision` is the table's latest."""

    stop: StopResult
    revision: int


@dataclass(frozen=True, slots=True)
class StoppedLate:
    """A background retry saw the acknowledgement (or a proof) after the terminal status."""

    stop: StopResult


SessionEvent = (
    Started
    | StartFailed
    | Observed
    | ProviderFailed
    | TimerDue
    | CutMade
    | EndRequested
    | CancelRequested
    | Terminate
    | EraseResult
    | Finishing
    | InternalFailure
    | Stopped
    | StoppedLate
)


# ---- effects ---------------------------------------------------------------------------------------------


class Effect(StrEnum):
    """What the runner must do for a step, besides telling the listener (`Emit`)."""

    NOTIFY = "notify"  # wake the status waiters
    WAKE = "wake"  # wake the runner's sleep (an end request)
    WAKE_IF_SOONER = "wake-if-sooner"  # wake it only when the table's next cut is sooner than its sleep
    CUT = "cut"  # cut a revision now, then feed `CutMade`
    FINAL_CUT = "final-cut"  # the final cut, then feed `CutMade`
    ERASE = "erase"  # drop the candidates
    STOP_PROVIDER = "stop-provider"  # the bounded stop, then feed `Stopped`


@dataclass(frozen=True, slots=True)
class Emit:
    """Tell the listener of a lifecycle event: `running`, `cancel-requested`, `ended`, `cleanup-confirmed`."""

    event: str


Effects = tuple[Effect | Emit, ...]

_NONE: Effects = ()
_WAKE_IF_SOONER: Effects = (Effect.WAKE_IF_SOONER,)
_OBSERVED = {outcome: Observed(outcome) for outcome in IngestOutcome}
# Outcomes whose step leaves the state as it is, with no effect: a runner may skip feeding them.
INERT_OUTCOMES: frozenset[IngestOutcome] = frozenset({IngestOutcome.UNCHANGED, IngestOutcome.OUT_OF_SCOPE})


def observed(outcome: IngestOutcome) -> Observed:
    """The event of one ingest outcome (shared values: the hot path allocates nothing)."""
    return _OBSERVED[outcome]


# ---- the step --------------------------------------------------------------------------------------------


def step(state: SessionState, event: SessionEvent, now_ms: int) -> tuple[SessionState, Effects]:
    """The state after `event` at `now_ms`, and what the runner must do about it."""
    if type(event) is Observed:  # the hot path (every observation): one type check before the match
        return _observed(state, event.outcome)
    match event:
        case Started():
            return _started(state, now_ms)
        case StartFailed():
            return _start_failed(state, event, now_ms)
        case ProviderFailed(code):
            return _request_end(state, EndCause.FAILURE, code)
        case TimerDue():
            return _timer_due(state, now_ms)
        case CutMade(revised, limit_reached):
            return _cut_made(state, revised, limit_reached, now_ms)
        case EndRequested(cause, code):
            return _request_end(state, cause, code)
        case CancelRequested():
            return _cancel(state, now_ms)
        case Terminate(code, erase):
            return _terminate(state, code, erase)
        case EraseResult():
            return _erase(state, now_ms)
        case Finishing():
            return state, _finishing(state)
        case InternalFailure():
            return _internal_failure(state)
        case Stopped(stop, revision):
            return _conclude(state, stop, revision, now_ms)
        case StoppedLate(stop):
            return _stopped_late(state, stop, now_ms)
    raise TypeError(f"not a session event: {type(event).__name__}")


def _observed(state: SessionState, outcome: IngestOutcome) -> tuple[SessionState, Effects]:
    """An accepted observation may bring the next cut closer; a refused one at the bound ends the session."""
    if outcome is IngestOutcome.ACCEPTED:
        return state, _WAKE_IF_SOONER
    if outcome is IngestOutcome.LIMIT_REACHED:
        return _request_end(state, EndCause.LIMIT, None)
    return state, _NONE


def _request_end(state: SessionState, cause: EndCause, code: str | None) -> tuple[SessionState, Effects]:
    """Set the end cause if it wins over the current one (`endings.OVERRIDES`)."""
    if state.is_terminal or not wins(cause, state.end_cause):
        return state, _NONE
    return replace(state, end_cause=cause, end_code=code), (Effect.WAKE,)


def _started(state: SessionState, now_ms: int) -> tuple[SessionState, Effects]:
    """pending -> running, unless a cancel came during the start (it then ends from pending)."""
    if state.cancellation is not None:
        return state, _NONE
    return _move(state, Event.START, now_ms)


def _start_failed(state: SessionState, event: StartFailed, now_ms: int) -> tuple[SessionState, Effects]:
    """The session concludes without running: with what the start left (`event.stop`)."""
    cause, code = _cut_cause(state, now_ms) if event.cut else (EndCause.FAILURE, event.code)
    if state.cancellation is not None:
        cause = EndCause.CANCEL
    detail = event.detail if event.detail is not None else state.error_detail
    ended = replace(state, end_cause=cause, end_code=code, error_detail=detail)
    return _conclude(ended, event.stop, 0, now_ms)


def _cut_cause(state: SessionState, now_ms: int) -> tuple[EndCause, str | None]:
    """Why a start was cut off: expiry, else the connector timeout."""
    expires_at_ms = state.spec.expires_at_ms
    if expires_at_ms is not None and now_ms >= expires_at_ms:
        return EndCause.EXPIRY, None
    return EndCause.FAILURE, DEADLINE_EXCEEDED


def _timer_due(state: SessionState, now_ms: int) -> tuple[SessionState, Effects]:
    """The earliest passed deadline ends the session (`endings.due_cause`); else cut what changed."""
    if state.end_cause is not None:
        return state, _NONE
    spec = state.spec
    cause = due_cause(
        now_ms,
        window_end_ms=spec.window_end_ms,
        cut_by_deadline=spec.cut_by_deadline,
        timeout_at_ms=spec.timeout_at_ms,
        expires_at_ms=spec.expires_at_ms,
    )
    if cause is not None:
        return _request_end(state, cause, None)
    return state, (Effect.CUT,)


def _cut_made(
    state: SessionState, revised: bool, limit_reached: bool, now_ms: int
) -> tuple[SessionState, Effects]:
    """A new revision moves only the caller-private `updated_at` (its timing follows the devices)."""
    effects: Effects = _NONE
    if revised:
        state, effects = replace(state, updated_at_ms=now_ms), (Effect.NOTIFY,)
    if limit_reached:
        state, more = _request_end(state, EndCause.LIMIT, None)
        effects += more
    return state, effects


def _cancel(state: SessionState, now_ms: int) -> tuple[SessionState, Effects]:
    """Stays non-terminal, without progress, until the stop is acknowledged."""
    ended, effects = _request_end(state, EndCause.CANCEL, None)
    if ended is state:
        return state, _NONE
    requested = replace(ended, cancellation=CancellationState.REQUESTED, cancellation_requested_at_ms=now_ms)
    return requested, (*effects, Effect.NOTIFY, Emit("cancel-requested"))


def _terminate(state: SessionState, code: str, erase: bool) -> tuple[SessionState, Effects]:
    """Overrides any end but a cancel in progress; an erase happens whether or not it wins."""
    if state.is_terminal:
        return state, _NONE
    erased: Effects = (Effect.ERASE, Effect.NOTIFY) if erase else _NONE
    ended, effects = _request_end(state, EndCause.TERMINATE, code)
    return ended, erased + effects


def _erase(state: SessionState, now_ms: int) -> tuple[SessionState, Effects]:
    if state.erased_at_ms is not None:
        return state, _NONE
    return replace(state, erased_at_ms=now_ms), (Effect.ERASE, Effect.NOTIFY)


def _finishing(state: SessionState) -> Effects:
    """A completing end cuts its final revision; a restart drops the generation; every end stops."""
    if state.end_cause in COMPLETING:
        return (Effect.FINAL_CUT, Effect.STOP_PROVIDER)
    if state.end_cause is EndCause.FAILURE and state.end_code == PROVIDER_RESTARTED:
        return (Effect.ERASE, Effect.STOP_PROVIDER)
    return (Effect.STOP_PROVIDER,)


def _internal_failure(state: SessionState) -> tuple[SessionState, Effects]:
    if state.is_terminal:
        return state, (Effect.ERASE,)
    failed = replace(state, end_cause=EndCause.FAILURE, end_code=PROVIDER_FAILURE)
    return failed, (Effect.ERASE, Effect.STOP_PROVIDER)


def _conclude(
    state: SessionState, stop: StopResult, revision: int, now_ms: int
) -> tuple[SessionState, Effects]:
    """Report the terminal status for the end cause (`endings.conclude`), now that the stop ended."""
    ending = conclude(state.end_cause or EndCause.FAILURE, state.end_code, stop)
    confirmed = ending.cancellation is CancellationState.CONFIRMED
    concluded = replace(
        state,
        ending=ending,
        cleanup=ending.cleanup,
        diagnostics=ending.diagnostics,
        reason=ending.reason,
        error_code=ending.error_code,
        cancellation=ending.cancellation if ending.cancellation is not None else state.cancellation,
        cancellation_confirmed_at_ms=now_ms if confirmed else state.cancellation_confirmed_at_ms,
        final_revision=revision if ending.keeps_result else state.final_revision,
    )
    # A session that did not complete is never bindable: its candidates are dropped now.
    erased: Effects = _NONE if ending.keeps_result else (Effect.ERASE,)
    moved, effects = _move(concluded, event_for(state.status, ending.status), now_ms)
    return moved, erased + effects


def _stopped_late(state: SessionState, stop: StopResult, now_ms: int) -> tuple[SessionState, Effects]:
    """Only cleanup (and the claim derived from it) move."""
    if state.ending is None:
        return state, _NONE
    ending = confirmed_late(state.ending, stop)
    late = replace(state, ending=ending, cleanup=ending.cleanup, diagnostics=ending.diagnostics)
    return _touched(late, now_ms), (Effect.NOTIFY, Emit("cleanup-confirmed"))


def _move(state: SessionState, event: Event, now_ms: int) -> tuple[SessionState, Effects]:
    """One lifecycle move, as the table says; a lifecycle change moves both `updated_at`s."""
    new = next_status(state.status, event)
    terminal = is_terminal(new)
    moved = replace(_touched(state, now_ms), status=new, terminal_at_ms=now_ms if terminal else None)
    return moved, (Effect.NOTIFY, Emit("ended" if terminal else new.value))


def _touched(state: SessionState, now_ms: int) -> SessionState:
    return replace(state, updated_at_ms=now_ms, state_changed_at_ms=now_ms)


# ---- time ------------------------------------------------------------------------------------------------


def start_deadline_ms(spec: SessionSpec) -> int | None:
    """The start is cut off at the connector timeout or the expiry, whichever comes first."""
    times = [t for t in (spec.timeout_at_ms, spec.expires_at_ms) if t is not None]
    return min(times) if times else None


def next_wake_ms(spec: SessionSpec, next_cut_ms: int | None, now_ms: int) -> int:
    """When the runner looks again by itself: the next deadline or the next possible cut."""
    times = [spec.window_end_ms]
    times += [t for t in (spec.timeout_at_ms, spec.expires_at_ms) if t is not None]
    if next_cut_ms is not None:
        times.append(max(next_cut_ms, now_ms + MIN_WAKE_MS))
    return min(times)


__all__ = [
    "CancelRequested",
    "CutMade",
    "Effect",
    "Effects",
    "Emit",
    "EndRequested",
    "EraseResult",
    "Finishing",
    "InternalFailure",
    "Observed",
    "ProviderFailed",
    "SessionEvent",
    "SessionState",
    "StartFailed",
    "Started",
    "Stopped",
    "StoppedLate",
    "Terminate",
    "TimerDue",
    "initial_state",
    "next_wake_ms",
    "observed",
    "start_deadline_ms",
    "step",
]
