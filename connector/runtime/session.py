"""One discovery session (CONTRACT §6.2, 6.4, 6.7): the runner of `connector.core.session_state`.

Rules of this file:
- what the session records is one frozen `SessionState`; it changes only through `session_state.step`
  (driven by the lifecycle and endings tables); this runner feeds it events from the provider sink, the
  timer and the requests, and carries out the effects the step returns;
- the candidate table stays a mutable object beside the state: ingest is the hot path (the BLE bench), and
  a frozen table would allocate per observation;
- all time goes through the injected `Timer`: its now, its sleeps, its deadlines (no wall clock here);
- EVERY end stops the provider session (bounded by the provider base: `cleanup_timeout_ms`, plus the
  qualified proof, and backstopped here) and reports the terminal status only after that; an uncertain
  cleanup keeps the claim for the manager's background retry;
- nothing candidate-derived reaches a log record or an exception message.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import anyio

from connector.core.admission import SessionSpec
from connector.core.endings import (
    CANCELLATION_UNCONFIRMED,
    CLEANUP_UNCONFIRMED,
    DEADLINE_EXCEEDED,
    PROVIDER_FAILURE,
    PROVIDER_RESTARTED,
    ClaimState,
    CleanupState,
    EndCause,
    StopResult,
    claim_of,
)
from connector.core.ids import OPERATION_KIND
from connector.core.lifecycle import Status
from connector.core.observations import Observation
from connector.core.projections import SessionView
from connector.core.scope import DiscoveryScope
from connector.core.session_state import (
    INERT_OUTCOMES,
    CancelRequested,
    CutMade,
    Effect,
    Effects,
    Emit,
    EndRequested,
    EraseResult,
    Finishing,
    InternalFailure,
    ProviderFailed,
    SessionEvent,
    SessionState,
    Started,
    StartFailed,
    Stopped,
    StoppedLate,
    Terminate,
    TimerDue,
    initial_state,
    next_wake_ms,
    observed,
    start_deadline_ms,
    step,
)
from connector.core.snapshot import CandidateTable
from connector.errors import ProviderError, ProviderUnavailable
from connector.runtime.claims import Claim
from connector.timer import WALL_TIMER, Timer
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

# The runtime's backstop beyond the provider's own bound (a backend not built on the base could hang).
_BACKSTOP_MARGIN_MS = 250
# Told of each lifecycle event (`running`, `cancel-requested`, `ended`, `cleanup-confirmed`); telemetry only.
SessionListener = Callable[[str, "DiscoverySession"], None]


class _Sink:
    """The provider-facing sink of one session (an object of its own, so providers see only two methods)."""

    __slots__ = ("_session",)

    def __init__(self, session: DiscoverySession) -> None:
        self._session: DiscoverySession | None = session

    def observe(self, observation: Observation) -> None:
        """One observation from the provider."""
        session = self._session
        if session is not None:
            session._observe(observation)

    def fail(self, error: ProviderError) -> None:
        """The provider failed or restarted."""
        session = self._session
        if session is not None:
            session._feed(ProviderFailed(getattr(error, "code", PROVIDER_FAILURE)))

    def detach(self) -> None:
        """The provider session stopped for good: nothing it still holds reaches the session."""
        self._session = None


class DiscoverySession:
    """One operation: its frozen state, its candidate table, and the runner `run()` that drives both."""

    def __init__(
        self,
        spec: SessionSpec,
        *,
        provider: Provider,
        table: CandidateTable,
        claim: Claim,
        timer: Timer = WALL_TIMER,
        listener: SessionListener | None = None,
    ) -> None:
        self.spec = spec
        self.provider = provider
        self.table = table
        self.claim = claim
        self._timer = timer
        self._state = initial_state(spec)
        self.disclosed: set[str] = set()
        self._provider_session: ProviderSession | None = None
        self._wake = anyio.Event()
        # When the runner will look again by itself; an observation wakes it only for something sooner.
        self._sleeping_until_ms = 0
        # Made when a long poll first asks for it: most sessions change with nobody waiting.
        self._changed: anyio.Event | None = None
        self.finished = anyio.Event()
        self.sink = _Sink(self)
        self._listener = listener
        # How long the latest provider stop took (acknowledged or not); telemetry only.
        self.last_stop_ms: int | None = None

    # ---- reading -------------------------------------------------------------------------------------------

    @property
    def state(self) -> SessionState:
        """Everything the session records, as one frozen value."""
        return self._state

    @property
    def status(self) -> Status:
        """The current status."""
        return self._state.status

    @property
    def is_terminal(self) -> bool:
        """True once the terminal status was reported."""
        return self._state.is_terminal

    @property
    def terminal_at_ms(self) -> int | None:
        """When the terminal status was reported."""
        return self._state.terminal_at_ms

    @property
    def erased_at_ms(self) -> int | None:
        """When retention (or a revocation) erased the result."""
        return self._state.erased_at_ms

    @property
    def cleanup_state(self) -> CleanupState:
        """`pending`, `confirmed` or `uncertain`."""
        return self._state.cleanup

    @property
    def revision(self) -> int:
        """The latest revision number (0 before the first cut or after an erase)."""
        latest = self.table.latest
        return 0 if latest is None else latest.revision

    @property
    def delivered_revision(self) -> int:
        """The revision a caller can see: none once a cancel was asked for or the result was erased."""
        if self._state.cancellation is not None or self._state.erased_at_ms is not None:
            return 0
        return self.revision

    @property
    def changed(self) -> anyio.Event:
        """An event set at the next status change (take it before waiting)."""
        if self._changed is None:
            self._changed = anyio.Event()
        return self._changed

    @property
    def cleanup_uncertain(self) -> bool:
        """True while a stop was not acknowledged and the claim is still held."""
        return self._state.cleanup is CleanupState.UNCERTAIN

    @property
    def claim_state(self) -> ClaimState:
        """Derived from cleanup: released exactly when cleanup is confirmed."""
        return claim_of(self._state.cleanup)

    def view(self) -> SessionView:
        """Everything a status projection needs, as one frozen value."""
        spec, state = self.spec, self._state
        latest = self.table.latest
        completed = state.status is Status.COMPLETED
        return SessionView(
            operation_id=spec.operation_id,
            operation_kind=OPERATION_KIND,
            owner=spec.owner,
            action_id=spec.action_id,
            scope=spec.scope,
            status=state.status.value,
            created_at_ms=spec.created_at_ms,
            updated_at_ms=state.updated_at_ms,
            expires_at_ms=spec.expires_at_ms,
            retry_after_seconds=None if state.is_terminal else spec.retry_after_seconds,
            reason=state.reason,
            error_code=state.error_code,
            cancellation_state=state.cancellation,
            cancellation_requested_at_ms=state.cancellation_requested_at_ms,
            cancellation_confirmed_at_ms=state.cancellation_confirmed_at_ms,
            cleanup_state=state.cleanup,
            claim=self.claim_state,
            diagnostics=state.diagnostics,
            latest=latest,
            final_revision=state.final_revision if completed else self.revision,
            erased_at_ms=state.erased_at_ms,
            disclosed_count=len(self.disclosed),
            causal_context=spec.causal_context,
            state_changed_at_ms=state.state_changed_at_ms,
            error_detail=state.error_detail,
        )

    # ---- requests from the manager -------------------------------------------------------------------------

    def request_end(self, cause: EndCause, code: str | None = None) -> bool:
        """Set the end cause if it wins over the current one (`endings.OVERRIDES`); stop accepting at once."""
        return self._ends(EndRequested(cause, code))

    def request_cancel(self) -> bool:
        """Record a caller's cancel; True when it changed anything (a repeat or a late one does not)."""
        return self._ends(CancelRequested())

    def terminate(self, code: str, *, erase: bool) -> bool:
        """End `failed` with `code` (revocation, shutdown), overriding any end but a cancel in progress."""
        return self._ends(Terminate(code, erase))

    def erase_result(self) -> None:
        """Retention ended: forget the candidates; status keeps reason and final revision."""
        self._feed(EraseResult())

    def cleanup_confirmed_late(self, stop: StopResult) -> None:
        """A background retry saw the acknowledgement (or a proof): cleanup confirmed, claim released."""
        self._feed(StoppedLate(stop))

    def _ends(self, event: SessionEvent) -> bool:
        before = self._state.end_cause
        self._feed(event)
        return self._state.end_cause is not before

    # ---- the step and its effects --------------------------------------------------------------------------

    def _observe(self, observation: Observation) -> None:
        """Ingest one observation; out-of-scope ones leave no trace (the table does not even count them)."""
        if self._state.end_cause is None:
            now_ms = self._timer.now_ms()
            outcome = self.table.ingest(observation, now_ms)
            if outcome not in INERT_OUTCOMES:  # the hot path: most observations change nothing
                self._feed(observed(outcome), now_ms)

    def _feed(self, event: SessionEvent, now_ms: int | None = None) -> Effects:
        """One step: the new state, then its effects (a cut feeds what it gave back in)."""
        if now_ms is None:
            now_ms = self._timer.now_ms()
        self._state, effects = step(self._state, event, now_ms)
        for effect in effects:
            self._apply(effect, now_ms)
        return effects

    def _apply(self, effect: Effect | Emit, now_ms: int) -> None:
        if isinstance(effect, Emit):
            self._emit(effect.event)
        elif effect is Effect.WAKE_IF_SOONER:
            due = self.table.next_cut_at_ms()
            if due is not None and due < self._sleeping_until_ms:
                self._wake.set()
        elif effect is Effect.WAKE:
            self._wake.set()
        elif effect is Effect.NOTIFY:
            if self._changed is not None:
                self._changed.set()
                self._changed = None
        elif effect is Effect.ERASE:
            self.table.erase()
        elif effect is Effect.CUT or effect is Effect.FINAL_CUT:
            revised = self.table.cut(now_ms, final=effect is Effect.FINAL_CUT) is not None
            self._feed(CutMade(revised, self.table.limit_reason is not None), now_ms)
        # STOP_PROVIDER is the runner's: it awaits (`_settle`).

    def _emit(self, event: str) -> None:
        """Tell the listener (telemetry); its failure never reaches the session."""
        if self._listener is None:
            return
        try:
            self._listener(event, self)
        except Exception as error:
            logger.error("session listener failed with %s", type(error).__name__)

    # ---- the runner ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Start the provider, watch the window, end once with a confirmed (or uncertain) stop."""
        try:
            if await self._start():
                await self._watch()
                await self._settle(self._feed(Finishing()))
        except Exception as error:  # a bug here must still end this session cleanly, and only this one
            # The type name only: an exception's text could quote device data.
            logger.error("discovery session %s: internal %s", self.spec.operation_id, type(error).__name__)
            await self._settle(self._feed(InternalFailure()))
        finally:
            self.finished.set()

    async def _settle(self, effects: Effects) -> None:
        """Carry out a stop the step asked for, then report what it gave."""
        if Effect.STOP_PROVIDER in effects:
            stop = await self.stop_provider()
            self._feed(Stopped(stop, self.revision))

    async def _start(self) -> bool:
        """pending -> running once the provider started; False when the session already concluded."""
        with self._timer.scope_until(start_deadline_ms(self.spec)) as cut:
            try:
                self._provider_session = await self.provider.start(self._provider_scope(), self.sink)
            except StartUnconfirmed as error:  # the backend may run: held as uncertain, retried in background
                self._provider_session = error.session
                uncertain = StopResult.UNCERTAIN
                self._feed(StartFailed(error.code, cut=cut.cancel_called, stop=uncertain))
                return False
            except ProviderUnavailable as error:  # its message is a fixed reason written by the provider
                self._feed(StartFailed(error.code, detail=error.message))
                return False
            except ProviderError as error:
                self._feed(StartFailed(error.code))
                return False
            except Exception:  # a backend bug must not take the other sessions down
                self._feed(StartFailed(PROVIDER_FAILURE))
                return False
            self._feed(Started())
            return True
        # The start was cut off by the connector timeout or expiry; its cancellation unwound it.
        self._feed(StartFailed(cut=True))
        return False

    def _provider_scope(self) -> DiscoveryScope:
        """The admitted scope on the adapter its claim is keyed by (the status keeps the scope as asked)."""
        adapter = self.spec.adapter
        return self.spec.scope if adapter is None else replace(self.spec.scope, adapter=adapter)

    async def _watch(self) -> None:
        """Cut revisions as content changes (coalesced) until an end cause is set."""
        while self._state.end_cause is None:
            self._feed(TimerDue())
            if self._state.end_cause is not None:
                return
            self._wake = anyio.Event()
            now_ms = self._timer.now_ms()
            self._sleeping_until_ms = next_wake_ms(self.spec, self.table.next_cut_at_ms(), now_ms)
            # Until the next deadline, or earlier when an observation or an end request wakes us.
            with self._timer.scope_until(self._sleeping_until_ms):
                await self._wake.wait()

    async def stop_provider(self) -> StopResult:
        """One shielded stop of the provider session; once it is acknowledged (or proven), the session
        lets the provider session go."""
        result = await self._stop_once()
        if result is not StopResult.UNCERTAIN:
            # No cycle (session -> provider session -> sink -> session) outlives the stop: once the
            # manager forgets this session, reference counting frees it, not a full garbage collection
            # walking every retained session on the loop's thread (issue 17: the status poll's p99).
            self._provider_session = None
            self.sink.detach()
        return result

    async def _stop_once(self) -> StopResult:
        """One shielded stop of the provider session (the provider bounds it; the runtime backstops it)."""
        session = self._provider_session
        if session is None:
            return StopResult.ACKNOWLEDGED
        started_ms = self._timer.now_ms()
        backstop_at_ms = started_ms + stop_bound_ms(self.spec.scope) + _BACKSTOP_MARGIN_MS
        try:
            with self._timer.scope_until(backstop_at_ms, shield=True):
                try:
                    outcome = await session.stop()
                except Exception:  # StopUnconfirmed or any backend error: neither acknowledged nor proven
                    return StopResult.UNCERTAIN
                return StopResult.PROVEN if outcome is StopOutcome.PROVEN else StopResult.ACKNOWLEDGED
            return StopResult.UNCERTAIN
        finally:
            self.last_stop_ms = self._timer.now_ms() - started_ms
