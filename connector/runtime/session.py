"""One discovery session (SPEC 6.2, 6.4, 6.7): provider start, candidate table, revision cuts, confirmed end.

Rules of this file:
- every status change goes through `connector.core.lifecycle.check_transition`;
- a session ends for one cause; the first wins, but until the stop is confirmed a caller's cancel replaces
  any other cause, and a revocation or shutdown replaces any cause but a cancel; observations stop counting
  the moment a cause is set;
- EVERY end stops the provider session bounded by `cleanup_timeout_ms` and reports the terminal status only
  after that: an acknowledgement confirms cleanup and releases the claim; a raise or a stall leaves cleanup
  `uncertain` with the claim held, for the manager's background retry;
- nothing candidate-derived reaches a log record or an exception message.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import anyio

from connector.core.ids import OPERATION_KIND
from connector.core.lifecycle import Status, check_transition, is_terminal
from connector.core.observations import Observation
from connector.core.projections import SessionView
from connector.core.scope import DiscoveryProfile, DiscoveryScope
from connector.core.snapshot import CandidateTable, IngestOutcome
from connector.errors import ProviderError, ProviderUnavailable
from connector.runtime.claims import Claim
from providers.base import Provider, ProviderSession

logger = logging.getLogger(__name__)

DEADLINE_EXCEEDED = "deadline-exceeded"
CLEANUP_UNCONFIRMED = "cleanup-unconfirmed"
CANCELLATION_UNCONFIRMED = "cancellation-unconfirmed"
PROVIDER_FAILURE = "provider-failure"
PROVIDER_RESTARTED = "provider-restarted"
# A pending cut re-checked sooner than this would only spin: whole-second content cannot change faster.
_MIN_WAKE_MS = 5


class EndCause(StrEnum):
    """Why a session ends."""

    WINDOW = "window-complete"
    DEADLINE = "deadline-reached"
    LIMIT = "limit-reached"
    FAILURE = "provider-failure"
    CANCEL = "cancel"
    TIMEOUT = "timed-out"
    EXPIRY = "expired"
    TERMINATE = "terminate"


_COMPLETING = frozenset({EndCause.WINDOW, EndCause.DEADLINE, EndCause.LIMIT})


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """What admission decided for one scan; fixed for the life of the session."""

    operation_id: str
    owner: str
    action_id: str
    scope: DiscoveryScope
    profile: DiscoveryProfile
    created_at_ms: int
    window_end_ms: int
    cut_by_deadline: bool
    timeout_at_ms: int | None
    expires_at_ms: int | None
    causal_context: Mapping[str, Any] | None
    retry_after_seconds: int


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
        self.cancellation_state: str | None = None
        self.cancellation_requested_at_ms: int | None = None
        self.cancellation_confirmed_at_ms: int | None = None
        self.cleanup_state = "pending"
        self.claim_state = "held"
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
        return self.cleanup_state == "uncertain"

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
        """Set the end cause unless one is set already; stop accepting observations at once."""
        if self.end_cause is not None or self.is_terminal:
            return False
        self.end_cause = cause
        self._end_code = code
        self._accepting = False
        self._wake.set()
        return True

    def request_cancel(self) -> bool:
        """Record a caller's cancel: stays non-terminal, without progress, until the stop is acknowledged."""
        if self.is_terminal or self.cancellation_state is not None or self.end_cause is EndCause.TERMINATE:
            return False
        self.cancellation_state = "requested"
        self.cancellation_requested_at_ms = self._clock()
        self.end_cause = EndCause.CANCEL
        self._end_code = None
        self._accepting = False
        self._wake.set()
        self._notify()
        return True

    def terminate(self, code: str, *, erase: bool) -> bool:
        """End `failed` with `code` (revocation, shutdown), overriding any end but a cancel in progress."""
        if self.is_terminal or self.end_cause is EndCause.CANCEL:
            return False
        if erase:
            self.table.erase()
            self._notify()
        self.end_cause = EndCause.TERMINATE
        self._end_code = code
        self._accepting = False
        self._wake.set()
        return True

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
        with anyio.move_on_after(self._seconds_until(self._hard_deadline_ms())):
            try:
                self._provider_session = await self.provider.start(self.spec.scope, self.sink)
            except ProviderUnavailable as error:  # its message is a fixed reason written by the provider
                self.error_detail = error.message
                self._conclude_unstarted(error.code)
                return False
            except ProviderError as error:
                self._conclude_unstarted(error.code)
                return False
            except Exception:  # a backend bug must not take the other sessions down
                self._conclude_unstarted(PROVIDER_FAILURE)
                return False
            if self.cancellation_state is None:
                self._move(Status.RUNNING)
            return True
        # The start was cut off by the connector timeout or expiry; its cancellation unwound it.
        self._conclude_unstarted(DEADLINE_EXCEEDED, expired=self._expired(self._clock()))
        return False

    async def _watch(self) -> None:
        """Cut revisions as content changes (coalesced) until an end cause is set."""
        while self.end_cause is None:
            now = self._clock()
            self._check_times(now)
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
        if cause in _COMPLETING:
            if self.table.cut(self._clock(), final=True) is not None:
                self._revised()
        elif cause is EndCause.FAILURE and self._end_code == PROVIDER_RESTARTED:
            self.table.erase()
        acknowledged = await self.stop_provider()
        self._conclude(acknowledged)

    async def stop_provider(self) -> bool:
        """One bounded, shielded stop of the provider session; True only when it acknowledged."""
        session = self._provider_session
        if session is None:
            return True
        with anyio.move_on_after(self.spec.profile.cleanup_timeout_ms / 1000.0, shield=True):
            try:
                await session.stop()
            except Exception:  # StopUnconfirmed or any backend error: not an acknowledgement
                return False
            return True
        return False

    def cleanup_acknowledged_late(self) -> None:
        """A background retry saw the acknowledgement: cleanup confirmed, claim released."""
        self.cleanup_state = "confirmed"
        self.claim_state = "released"
        self._touch()

    # ---- time ----------------------------------------------------------------------------------------------

    def _hard_deadline_ms(self) -> int | None:
        times = [t for t in (self.spec.timeout_at_ms, self.spec.expires_at_ms) if t is not None]
        return min(times) if times else None

    def _seconds_until(self, at_ms: int | None) -> float:
        return math.inf if at_ms is None else max(0.0, (at_ms - self._clock()) / 1000.0)

    def _expired(self, now_ms: int) -> bool:
        return self.spec.expires_at_ms is not None and now_ms >= self.spec.expires_at_ms

    def _check_times(self, now_ms: int) -> None:
        """The earliest passed deadline ends the session (window first on a tie)."""
        spec = self.spec
        window_cause = EndCause.DEADLINE if spec.cut_by_deadline else EndCause.WINDOW
        candidates = [
            (spec.window_end_ms, 0, window_cause),
            (spec.timeout_at_ms, 1, EndCause.TIMEOUT),
            (spec.expires_at_ms, 2, EndCause.EXPIRY),
        ]
        passed = [(at, rank, cause) for at, rank, cause in candidates if at is not None and now_ms >= at]
        if passed:
            self.request_end(min(passed)[2])

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

    def _conclude_unstarted(self, code: str, *, expired: bool = False) -> None:
        """No provider session exists: nothing to stop, cleanup is trivially confirmed."""
        self.cleanup_state = "confirmed"
        self.claim_state = "released"
        self._accepting = False
        self.table.erase()
        if self.cancellation_state == "requested":
            self._confirm_cancel()
        elif expired:
            self.error_code = DEADLINE_EXCEEDED
            self._move(Status.EXPIRED)
        else:
            self.error_code = code
            self._move(Status.FAILED)

    def _conclude(self, acknowledged: bool) -> None:
        """Report the terminal status for the end cause, now that the stop returned or gave up."""
        self.cleanup_state = "confirmed" if acknowledged else "uncertain"
        self.claim_state = "released" if acknowledged else "held"
        cause = self.end_cause
        if cause is EndCause.CANCEL:
            self._conclude_cancel(acknowledged)
        elif cause in _COMPLETING and acknowledged:
            self.reason = cause.value if cause is not None else None
            self.final_revision = self.revision
            self._move(Status.COMPLETED)
        elif cause in (EndCause.TIMEOUT, EndCause.EXPIRY):
            self._conclude_deadline(cause)
        else:
            self.error_code = self._end_code if acknowledged else CLEANUP_UNCONFIRMED
            self._conclude_failed()

    def _conclude_cancel(self, acknowledged: bool) -> None:
        if acknowledged:
            self._confirm_cancel()
            return
        self.cancellation_state = "uncertain"
        self.error_code = CANCELLATION_UNCONFIRMED
        self._conclude_failed()

    def _confirm_cancel(self) -> None:
        self.cancellation_state = "confirmed"
        self.cancellation_confirmed_at_ms = self._clock()
        self.table.erase()
        self._move(Status.CANCELLED)

    def _conclude_deadline(self, cause: EndCause) -> None:
        self.table.erase()
        self.error_code = DEADLINE_EXCEEDED
        self._move(Status.EXPIRED if cause is EndCause.EXPIRY else Status.TIMED_OUT)

    def _conclude_failed(self) -> None:
        # A failed session is never bindable: its candidates have no further use and are dropped now.
        self.table.erase()
        self._move(Status.FAILED)


class SessionHandle:
    """A read-only handle on one session, for the layers that bind, select or report it."""

    __slots__ = ("_session",)

    def __init__(self, session: DiscoverySession) -> None:
        self._session = session

    @property
    def operation_id(self) -> str:
        """The operation id."""
        return self._session.spec.operation_id

    @property
    def owner(self) -> str:
        """The principal that started the scan."""
        return self._session.spec.owner

    @property
    def action_id(self) -> str:
        """The catalog action."""
        return self._session.spec.action_id

    @property
    def scope(self) -> DiscoveryScope:
        """The admitted scope."""
        return self._session.spec.scope

    @property
    def generation(self) -> str:
        """The candidate generation of this session."""
        return self._session.table.generation

    @property
    def status(self) -> Status:
        """The current status."""
        return self._session.status

    @property
    def cleanup_state(self) -> str:
        """`pending`, `confirmed` or `uncertain`."""
        return self._session.cleanup_state

    @property
    def termination_confirmed(self) -> bool:
        """True once the session is terminal and its provider stop was acknowledged."""
        return self._session.is_terminal and self._session.cleanup_state == "confirmed"

    def binding_target(self, ref: str) -> tuple[str, str] | None:
        """(transport, address) of a current candidate of this session."""
        return self._session.table.binding_target(ref)

    def candidate_expires_at_ms(self, ref: str) -> int | None:
        """When a current candidate of this session expires."""
        return self._session.table.candidate_expires_at_ms(ref)

    def candidate_document(self, ref: str) -> dict[str, Any] | None:
        """The current candidate document of a ref (caller-private)."""
        return self._session.table.candidate_document(ref)
