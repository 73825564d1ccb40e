"""The provider seam: one small interface per transport, shaped like bleak's backends.

A provider starts one session per admitted scope and pushes observations into a sink. `stop()` is
idempotent and returns only once *this* session ended: acknowledged by the backend, or proven by a
qualified proof (CONTRACT §6.7); it raises `StopUnconfirmed` otherwise. Driver errors are translated at the
edge into `connector.errors.ProviderError` subclasses.

`BaseSession` is what every backend shares, as bleak's `BaseBleakScanner` is for its backends: the
closed/confirmed gate, the compiled scope re-filter, and the one owner of the cleanup bound (measured on the
injected `Timer`: the wall one for real backends, a virtual one in tests). A backend translates native data
into observations (`deliver`), reports failures (`fail`) and implements its own stop (`_stop_backend`, and
`_prove_stopped` where it has a second kind of confirmation).

`finish_cleanup` is the one way to finish cleanup through a cancel: the cleanup runs to its end, and a
cancel that came meanwhile is raised after it, never swallowed.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol, TypeVar

import anyio

from connector.contract.transports import Transport
from connector.core.observations import Observation
from connector.core.policy import PROOF_BOUND_MS
from connector.core.scope import DiscoveryScope, scope_matcher
from connector.errors import ProviderError, StopUnconfirmed
from connector.timer import WALL_TIMER, Timer


class StopOutcome(StrEnum):
    """How a stop ended this session: the backend said so, or a qualified proof showed it."""

    ACKNOWLEDGED = "acknowledged"
    PROVEN = "proven"


def stop_bound_ms(scope: DiscoveryScope) -> int:
    """The longest a `BaseSession.stop()` takes: the cleanup bound plus the proof."""
    return scope.cleanup_timeout_ms + PROOF_BOUND_MS


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

    async def stop(self) -> StopOutcome | None:
        """Stop this session; return only once it ended (None counts as acknowledged). Idempotent."""


class Provider(Protocol):
    """A transport's scanner."""

    @property
    def capabilities(self) -> ProviderCapabilities:
        """Declared capabilities."""

    async def start(self, scope: DiscoveryScope, sink: ObservationSink) -> ProviderSession:
        """Start a session for `scope`; raise `ProviderError` when it cannot start."""


class BaseSession(ABC):
    """The shared part of a provider session: gate, scope re-filter, bounded and idempotent stop."""

    # True: a stop() that finds an earlier attempt still running waits for that one (BlueZ may still
    # answer it); False: each stop() starts a fresh attempt and drops a stalled one.
    rejoin_stalled_attempt = True

    def __init__(self, scope: DiscoveryScope, sink: ObservationSink, timer: Timer = WALL_TIMER) -> None:
        self.scope = scope
        self._sink = sink
        self._timer = timer
        # The same rule as `matches_scope`, compiled once: it runs for every observation.
        self._in_scope = scope_matcher(scope)
        self._open = False
        self._outcome: StopOutcome | None = None
        self._attempt: StopAttempt | None = None

    @property
    def is_open(self) -> bool:
        """True from `opened()` until the session stops or fails."""
        return self._open

    def opened(self) -> None:
        """The backend runs: observations count from now on."""
        if self._outcome is None:
            self._open = True

    def deliver(self, observation: Observation) -> None:
        """Pass one native observation on, if the session is open and it is in scope."""
        if self._open and self._in_scope(observation):
            self._sink.observe(observation)

    def deliver_prefiltered(self, observation: Observation) -> None:
        """Pass on an observation the backend already re-filtered with the same compiled rule."""
        if self._open:
            self._sink.observe(observation)

    def fail(self, error: ProviderError) -> None:
        """The backend failed mid-session: report it once and close the gate."""
        if self._open:
            self._open = False
            self._sink.fail(error)

    async def stop(self) -> StopOutcome:
        """Stop within `cleanup_timeout_ms` (+ the proof); raise `StopUnconfirmed` when neither came."""
        if self._outcome is not None:
            return self._outcome
        self._open = False
        attempt = self._next_attempt()
        # The attempt runs on by itself past this bound: a later stop() may join it.
        refusal = await attempt.refusal_by(self._timer, self._timer.now_ms() + self.scope.cleanup_timeout_ms)
        outcome = StopOutcome.ACKNOWLEDGED
        if refusal is not None:
            if not await self._bounded_proof():
                raise StopUnconfirmed("the backend did not acknowledge the stop", diagnostics=_rule(refusal))
            outcome = StopOutcome.PROVEN
        self._outcome = outcome
        return outcome

    def _next_attempt(self) -> StopAttempt:
        attempt = self._attempt
        if attempt is not None and not attempt.done and self.rejoin_stalled_attempt:
            return attempt
        if attempt is not None and not attempt.done:
            attempt.cancel()
        elif attempt is not None and attempt.acknowledged:
            return attempt
        self._attempt = StopAttempt(self._stop_backend)
        return self._attempt

    async def _bounded_proof(self) -> bool:
        with self._timer.scope_until(self._timer.now_ms() + PROOF_BOUND_MS):
            try:
                return await self._prove_stopped()
            except Exception:  # the proof itself failed: not proven either way
                return False
        return False  # timed out

    @abstractmethod
    async def _stop_backend(self) -> str | None:
        """One stop attempt: None once the backend acknowledged, else the rule that refused."""

    async def _prove_stopped(self) -> bool:
        """A qualified proof that the session ended although the backend did not say so (default: none)."""
        return False


class StopAttempt:
    """One backend stop attempt, in a loop task of its own so that a stalled one outlives the bound that cut
    it (a task group would make every provider session an async context)."""

    __slots__ = ("_done", "_refusal", "_task")

    def __init__(self, stop_backend: Callable[[], Awaitable[str | None]]) -> None:
        self._done = anyio.Event()
        # A cancelled attempt counts as a refusal, as one that raised.
        self._refusal: str | None = "stop-cancelled"
        self._task = asyncio.ensure_future(self._run(stop_backend))

    async def _run(self, stop_backend: Callable[[], Awaitable[str | None]]) -> None:
        try:
            self._refusal = await stop_backend()
        except Exception:  # a backend bug counts as a refusal: only StopUnconfirmed leaves stop()
            self._refusal = "backend-error"
        finally:
            self._done.set()

    @property
    def done(self) -> bool:
        """True once the attempt ended (answered, raised or was cancelled)."""
        return self._done.is_set()

    @property
    def acknowledged(self) -> bool:
        """True once the attempt ended with the backend's acknowledgement."""
        return self.done and self._refusal is None

    def cancel(self) -> None:
        """Drop a stalled attempt."""
        self._task.cancel()

    async def finished(self) -> None:
        """Return once the attempt ended."""
        await self._done.wait()

    async def refusal_by(self, timer: Timer, at_ms: int) -> str | None:
        """None when the attempt acknowledged by `at_ms`, else its refusal (`stop-timeout`: still open)."""
        with timer.scope_until(at_ms):
            await self._done.wait()
        return self._refusal if self.done else "stop-timeout"


class StartUnconfirmed(ProviderError):
    """A start failed after the backend may have begun, with no proof: the session still needs its stop."""

    def __init__(self, message: str, session: ProviderSession) -> None:
        super().__init__(message)
        self.session = session


_T = TypeVar("_T")


async def finish_cleanup(cleanup: Awaitable[_T]) -> _T:
    """Run `cleanup` to its end even when the caller is cancelled meanwhile, then raise that cancel.

    Shielded from anyio's cancellation, which stays pending and is raised at the caller's next checkpoint
    (so a failure path may still raise its own error first); a native `Task.cancel()` that still reaches
    the caller is held until the cleanup ended and raised then.
    """
    task = asyncio.ensure_future(cleanup)
    held: BaseException | None = None
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError as cancel:
                held = cancel
    if held is not None:
        raise held
    return task.result()


def _rule(refusal: str) -> list[dict[str, str]]:
    return [{"code": "provider-stop", "message": refusal}]
