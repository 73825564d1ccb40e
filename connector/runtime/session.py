"""One discovery session (CONTRACT §6.2, 6.4, 6.7): provider start, candidate table, revision cuts, confirmed
end.

Rules of this file:
- every status change goes through `connector.core.lifecycle.check_transition`;
- which end cause wins, and what each end gives, is `connector.core.endings` (data + one pure function);
  observations stop counting the moment a cause is set;
- EVERY end stops the provider session (bounded by the provider base: `cleanup_timeout_ms`, plus the
  qualified proof) and reports the terminal status only after that; an uncertain cleanup keeps the claim
  for the manager's background retry;
- nothing candidate-derived reaches a log record or an exception message.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import replace

import anyio

from connector.core.admission import SessionSpec
from connector.core.endings import (
    CANCELLATION_UNCONFIRMED,
    CLEANUP_UNCONFIRMED,
    COMPLETING,
    DEADLINE_EXCEEDED,
    PROVIDER_FAILURE,
    PROVIDER_RESTARTED,
    CancellationState,
    ClaimState,
    CleanupState,
    EndCause,
    Ending,
    StopResult,
    claim_of,
    conclude,
    confirmed_late,
    due_cause,
    wins,
)
from connector.core.ids import OPERATION_KIND
from connector.core.lifecycle import Status, check_transition, is_terminal
from connector.core.observations import Observation
from connector.core.projections import SessionView
from connector.core.scope import DiscoveryScope
from connector.core.snapshot import CandidateTable, IngestOutcome
from connector.errors import ProviderError, ProviderUnavailable
from connector.runtime.claims import Claim
from providers.base import Provider, ProviderSession, StartUnconfirmed, StopOutcome, stop_bound_ms

logger = logging.getLogger(__name__)

__all__ = [
    "CANCELLATION_UNCONFIRMED",
    "CLEANUP_UNCONFIRMED",
    "DEADLINE_EXCEEDED",
    "PROVIDER_FAILURE",
    "PROVIDER_RESTARTED",
    "DiscoverySession",
    "EndCause",
]

# A pending cut re-checked sooner than this would only spin: whole-second content cannot change faster.
_MIN_WAKE_MS = 5
# The runtime's backstop beyond the provider's own bound (a backend not built on the base could hang).
_BACKSTOP_MARGIN_MS = 250
# Told of each lifecycle event (`running`, `cancel-requested`, `ended`, `cleanup-confirmed`); telemetry only.
SessionListener = Callable[[str, "DiscoverySession"], None]


class _Sink:
    """The provider-facing sink of one session (an object of its own, so providers see only two methods)."""

    __slots__ = ("_session",)

    def __init__(self, session: DiscoverySession) -> None:
        self._session = session

    def observe(self, observation: Observation) -> None:
        """One observation from the provider."""
        self._session.on_observation(observation)

    def fail(self, error: ProviderError) -> None:
        """The provider failed or restarted."""
        self._session.on_failure(error)


class DiscoverySession:
    """The mutable state of one operation, driven by `run()`; the manager reads it to project statuses."""

    def __init__(
        self,
        spec: SessionSpec,
        *,
        provider: Provider,
        table: CandidateTable,
        claim: Claim,
        clock: Callable[[], int],
        listener: SessionListener | None = None,
    ) -> None:
        self.spec = spec
        self.provider = provider
        self.table = table
        self.claim = claim
        self._clock = clock
        self.status = Status.PENDING
        self.updated_at_ms = spec.created_at_ms
        self.state_changed_at_ms = spec.created_at_ms
        self.reason: str | None = None
        self.error_code: str | None = None
        self.error_detail: str | None = None
        self.cancellation_state: CancellationState | None = None
        self.cancellation_requested_at_ms: int | None = None
        self.cancellation_confirmed_at_ms: int | None = None
        self.cleanup_state = CleanupState.PENDING
        self.diagnostics: tuple[str, ...] = ()
        self.ending: Ending | None = None
        self.erased_at_ms: int | None = None
        self.terminal_at_ms: int | None = None
        self.final_revision = 0
        self.disclosed: set[str] = set()
        self.end_cause: EndCause | None = None
        self._end_code: str | None = None
        self._accepting = True
        self._provider_session: ProviderSession | None = None
        self._wake = anyio.Event()
        # When the runner will look again by itself; an observation wakes it only for something sooner.
        self._sleeping_until_ms = 0
        self._changed = anyio.Event()
        self.finished = anyio.Event()
        self.sink = _Sink(self)
        self._listener = listener
        # How long the latest provider stop took (acknowledged or not); telemetry only.
        self.last_stop_ms: int | None = None

    # ---- reading -------------------------------------------------------------------------------------------

    @property
    def is_terminal(self) -> bool:
        """True once the terminal status was reported."""
        return is_terminal(self.status)

    @property
    def revision(self) -> int:
        """The latest revision number (0 before the first cut or after an erase)."""
        latest = self.table.latest
        return 0 if latest is None else latest.revision

    @property
    def delivered_revision(self) -> int:
        """The revision a caller can see: none once a cancel was asked for or the result was erased."""
        if self.cancellation_state is not None or self.erased_at_ms is not None:
            return 0
        return self.revision

    @property
    def changed(self) -> anyio.Event:
        """An event set at the next status change (take it before waiting)."""
        return self._changed

    @property
    def cleanup_uncertain(self) -> bool:
        """True while a stop was not acknowledged and the claim is still held."""
        return self.cleanup_state is CleanupState.UNCERTAIN

    @property
    def claim_state(self) -> ClaimState:
        """Derived from cleanup: released exactly when cleanup is confirmed."""
        return claim_of(self.cleanup_state)

    def view(self) -> SessionView:
        """Everything a status projection needs, as one frozen value."""
        spec = self.spec
        latest = self.table.latest
        completed = self.status is Status.COMPLETED
        return SessionView(
            operation_id=spec.operation_id,
            operation_kind=OPERATION_KIND,
            owner=spec.owner,
            action_id=spec.action_id,
            scope=spec.scope,
            status=self.status.value,
            created_at_ms=spec.created_at_ms,
            updated_at_ms=self.updated_at_ms,
            expires_at_ms=spec.expires_at_ms,
            retry_after_seconds=None if self.is_terminal else spec.retry_after_seconds,
            reason=self.reason,
            error_code=self.error_code,
            cancellation_state=self.cancellation_state,
            cancellation_requested_at_ms=self.cancellation_requested_at_ms,
            cancellation_confirmed_at_ms=self.cancellation_confirmed_at_ms,
            cleanup_state=self.cleanup_state,
            claim=self.claim_state,
            diagnostics=self.diagnostics,
            latest=latest,
            final_revision=self.final_revision if completed else self.revision,
            erased_at_ms=self.erased_at_ms,
            disclosed_count=len(self.disclosed),
            causal_context=spec.causal_context,
            state_changed_at_ms=self.state_changed_at_ms,
            error_detail=self.error_detail,
        )

    # ---- provider-facing (event-loop thread) ---------------------------------------------------------------

    def on_observation(self, observation: Observation) -> None:
        """Ingest one observation; out-of-scope ones leave no trace (the table does not even count them)."""
        if not self._accepting:
            return
        outcome = self.table.ingest(observation, self._clock())
        if outcome is IngestOutcome.ACCEPTED:
            due = self.table.next_cut_at_ms()
            if due is not None and due < self._sleeping_until_ms:
                self._wake.set()
        elif outcome is IngestOutcome.LIMIT_REACHED:
            self.request_end(EndCause.LIMIT)

    def on_failure(self, error: ProviderError) -> None:
        """The backend failed mid-session: end `failed` with its code."""
        self.request_end(EndCause.FAILURE, getattr(error, "code", PROVIDER_FAILURE))

    # ---- requests from the manager -------------------------------------------------------------------------

    def request_end(self, cause: EndCause, code: str | None = None) -> bool:
        """Set the end cause if it wins over the current one (`endings.OVERRIDES`); stop accepting at once."""
        if self.is_terminal or not wins(cause, self.end_cause):
            return False
        self.end_cause = cause
        self._end_code = code
        self._accepting = False
        self._wake.set()
        return True

    def request_cancel(self) -> bool:
        """Record a caller's cancel: stays non-terminal, without progress, until the stop is acknowledged."""
        if not self.request_end(EndCause.CANCEL):
            return False
        self.cancellation_state = CancellationState.REQUESTED
        self.cancellation_requested_at_ms = self._clock()
        self._notify()
        self._emit("cancel-requested")
        return True

    def terminate(self, code: str, *, erase: bool) -> bool:
        """End `failed` with `code` (revocation, shutdown), overriding any end but a cancel in progress."""
        if self.is_terminal:
            return False
        if erase:
            self.table.erase()
            self._notify()
        return self.request_end(EndCause.TERMINATE, code)

    def erase_result(self) -> None:
        """Retention ended: forget the candidates; status keeps reason and final revision."""
        if self.erased_at_ms is None:
            self.table.erase()
            self.erased_at_ms = self._clock()
            self._notify()

    # ---- the runner ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Start the provider, watch the window, end once with a confirmed (or uncertain) stop."""
        try:
            if await self._start():
                await self._watch()
                await self._finish()
        except Exception as error:  # a bug here must still end this session cleanly, and only this one
            # The type name only: an exception's text could quote device data.
            logger.error("discovery session %s: internal %s", self.spec.operation_id, type(error).__name__)
            await self._fail_internal()
        finally:
            self.finished.set()

    async def _fail_internal(self) -> None:
        """End `failed` after an internal error, with the usual bounded stop."""
        self._accepting = False
        self.table.erase()
        if self.is_terminal:
            return
        self.end_cause, self._end_code = EndCause.FAILURE, PROVIDER_FAILURE
        self._conclude(await self.stop_provider())

    async def _start(self) -> bool:
        """pending -> running once the provider started; False when the session already concluded."""
        with anyio.move_on_after(self._seconds_until(self._hard_deadline_ms())) as cut:
            try:
                self._provider_session = await self.provider.start(self._provider_scope(), self.sink)
            except StartUnconfirmed as error:  # the backend may run: held as uncertain, retried in background
                self._provider_session = error.session
                cause, code = self._cut_cause() if cut.cancel_called else (EndCause.FAILURE, error.code)
                self._conclude_unstarted(cause, code, StopResult.UNCERTAIN)
                return False
            except ProviderUnavailable as error:  # its message is a fixed reason written by the provider
                self.error_detail = error.message
                self._conclude_unstarted(EndCause.FAILURE, error.code)
                return False
            except ProviderError as error:
                self._conclude_unstarted(EndCause.FAILURE, error.code)
                return False
            except Exception:  # a backend bug must not take the other sessions down
                self._conclude_unstarted(EndCause.FAILURE, PROVIDER_FAILURE)
                return False
            if self.cancellation_state is None:
                self._move(Status.RUNNING)
            return True
        # The start was cut off by the connector timeout or expiry; its cancellation unwound it.
        self._conclude_unstarted(*self._cut_cause())
        return False

    def _provider_scope(self) -> DiscoveryScope:
        """The admitted scope on the adapter its claim is keyed by (the status keeps the scope as asked)."""
        adapter = self.spec.adapter
        return self.spec.scope if adapter is None else replace(self.spec.scope, adapter=adapter)

    def _cut_cause(self) -> tuple[EndCause, str | None]:
        """Why a start was cut off: expiry, else the connector timeout."""
        if self._expired(self._clock()):
            return EndCause.EXPIRY, None
        return EndCause.FAILURE, DEADLINE_EXCEEDED

    async def _watch(self) -> None:
        """Cut revisions as content changes (coalesced) until an end cause is set."""
        while self.end_cause is None:
            now = self._clock()
            self._end_if_due(now)
            if self.end_cause is not None:
                return
            self._cut(now)
            if self.end_cause is not None:
                return
            self._wake = anyio.Event()
            self._sleeping_until_ms = self._next_wake_ms(now)
            await self._sleep_until(self._sleeping_until_ms)

    async def _finish(self) -> None:
        """Final cut or erase, bounded stop, then the terminal status."""
        cause = self.end_cause
        if cause in COMPLETING:
            if self.table.cut(self._clock(), final=True) is not None:
                self._revised()
        elif cause is EndCause.FAILURE and self._end_code == PROVIDER_RESTARTED:
            self.table.erase()
        self._conclude(await self.stop_provider())

    async def stop_provider(self) -> StopResult:
        """One shielded stop of the provider session (the provider bounds it; the runtime backstops it)."""
        session = self._provider_session
        if session is None:
            return StopResult.ACKNOWLEDGED
        backstop_ms = stop_bound_ms(self.spec.scope) + _BACKSTOP_MARGIN_MS
        started_ms = self._clock()
        try:
            with anyio.move_on_after(backstop_ms / 1000.0, shield=True):
                try:
                    outcome = await session.stop()
                except Exception:  # StopUnconfirmed or any backend error: neither acknowledged nor proven
                    return StopResult.UNCERTAIN
                return StopResult.PROVEN if outcome is StopOutcome.PROVEN else StopResult.ACKNOWLEDGED
            return StopResult.UNCERTAIN
        finally:
            self.last_stop_ms = self._clock() - started_ms

    def cleanup_confirmed_late(self, stop: StopResult) -> None:
        """A background retry saw the acknowledgement (or a proof): cleanup confirmed, claim released."""
        if self.ending is None:
            return
        self._apply_cleanup(confirmed_late(self.ending, stop))
        self._touch()
        self._emit("cleanup-confirmed")

    # ---- time ----------------------------------------------------------------------------------------------

    def _hard_deadline_ms(self) -> int | None:
        times = [t for t in (self.spec.timeout_at_ms, self.spec.expires_at_ms) if t is not None]
        return min(times) if times else None

    def _seconds_until(self, at_ms: int | None) -> float:
        return math.inf if at_ms is None else max(0.0, (at_ms - self._clock()) / 1000.0)

    def _expired(self, now_ms: int) -> bool:
        return self.spec.expires_at_ms is not None and now_ms >= self.spec.expires_at_ms

    def _end_if_due(self, now_ms: int) -> None:
        """The earliest passed deadline ends the session (`endings.due_cause`)."""
        spec = self.spec
        cause = due_cause(
            now_ms,
            window_end_ms=spec.window_end_ms,
            cut_by_deadline=spec.cut_by_deadline,
            timeout_at_ms=spec.timeout_at_ms,
            expires_at_ms=spec.expires_at_ms,
        )
        if cause is not None:
            self.request_end(cause)

    def _next_wake_ms(self, now_ms: int) -> int:
        spec = self.spec
        times = [spec.window_end_ms]
        times += [t for t in (spec.timeout_at_ms, spec.expires_at_ms) if t is not None]
        next_cut = self.table.next_cut_at_ms()
        if next_cut is not None:
            times.append(max(next_cut, now_ms + _MIN_WAKE_MS))
        return min(times)

    async def _sleep_until(self, at_ms: int) -> None:
        """Wait for the next deadline, or earlier when an observation or an end request wakes us."""
        with anyio.move_on_after(self._seconds_until(at_ms)):
            await self._wake.wait()

    # ---- status changes ------------------------------------------------------------------------------------

    def _cut(self, now_ms: int) -> None:
        if self.table.cut(now_ms) is not None:
            self._revised()
        if self.table.limit_reason is not None:
            self.request_end(EndCause.LIMIT)

    def _move(self, new: Status) -> None:
        check_transition(self.status, new)
        self.status = new
        if is_terminal(new):
            self.terminal_at_ms = self._clock()
        self._touch()
        self._emit("ended" if is_terminal(new) else new.value)

    def _emit(self, event: str) -> None:
        """Tell the listener (telemetry); its failure never reaches the session."""
        if self._listener is None:
            return
        try:
            self._listener(event, self)
        except Exception as error:
            logger.error("session listener failed with %s", type(error).__name__)

    def _touch(self) -> None:
        """A lifecycle change: both the caller's and the durable `updated_at` move."""
        self.updated_at_ms = self.state_changed_at_ms = self._clock()
        self._notify()

    def _revised(self) -> None:
        """A new revision: only the caller-private `updated_at` moves (its timing follows the devices)."""
        self.updated_at_ms = self._clock()
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    def _conclude_unstarted(
        self, cause: EndCause, code: str | None = None, stop: StopResult = StopResult.ACKNOWLEDGED
    ) -> None:
        """The start failed: acknowledged when nothing was left, else uncertain (`StartUnconfirmed`)."""
        self._accepting = False
        if self.cancellation_state is not None:
            cause = EndCause.CANCEL
        self.end_cause, self._end_code = cause, code
        self._conclude(stop)

    def _conclude(self, stop: StopResult) -> None:
        """Report the terminal status for the end cause (`endings.conclude`), now that the stop ended."""
        cause = self.end_cause or EndCause.FAILURE
        ending = conclude(cause, self._end_code, stop)
        self.ending = ending
        self._apply_cleanup(ending)
        self.reason = ending.reason
        self.error_code = ending.error_code
        if ending.cancellation is not None:
            self.cancellation_state = ending.cancellation
        if ending.cancellation is CancellationState.CONFIRMED:
            self.cancellation_confirmed_at_ms = self._clock()
        if ending.keeps_result:
            self.final_revision = self.revision
        else:
            # A session that did not complete is never bindable: its candidates are dropped now.
            self.table.erase()
        self._move(ending.status)

    def _apply_cleanup(self, ending: Ending) -> None:
        self.ending = ending
        self.cleanup_state = ending.cleanup
        self.diagnostics = ending.diagnostics
