"""The discovery runtime: admits scans as sessions, answers their statuses, cleans up behind them.

`DiscoveryManager` owns one anyio task group (`async with`) and implements `Operations` for discovery. It
owns each scan's durable row: `admit` inserts it (before the runner starts, so the 202 leaves only after
the record) and every lifecycle change updates it, both through one `DiscoveryJournal`. Each session gets
a runner task; a session whose stop was not acknowledged keeps retrying in that task, holding the claim
until a late acknowledgement, whatever happened to its caller. One retention sweeper (not a task per
operation) erases completed results after `result_retention_seconds`; with a journal the session then
leaves memory and its status is answered from the durable record, so the sessions held are the live and the
recently ended ones only. Every wait, retry and sweep is on the injected `Timer`.
"""

from __future__ import annotations

import heapq
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, ClassVar, Protocol

import anyio
from anyio.abc import TaskGroup

from connector.core.admission import SessionSpec
from connector.core.endings import StopResult
from connector.core.ids import opaque_id
from connector.core.lifecycle import INTERRUPTED_BY_RESTART, Status
from connector.core.projections import caller_status_v2, disclosed_refs, durable_metadata
from connector.core.scope import DiscoveryScope
from connector.core.snapshot import CandidateTable
from connector.errors import Code, SensoriumError
from connector.runtime.claims import ClaimRegistry, claim_key
from connector.runtime.operations import Kind, Observed
from connector.runtime.session import DiscoverySession, SessionListener
from connector.storage.state import DiscoveryRecord
from connector.timer import WALL_TIMER, Timer, scope_after
from providers.base import Provider

DEFAULT_METADATA_RETENTION_SECONDS = 7 * 24 * 3600
_log = logging.getLogger("sensorium.discovery")


class DiscoveryJournal(Protocol):
    """The durable rows of scans (`connector.storage.state.ConnectorState`): inserted, then updated."""

    async def insert_discovery(self, record: DiscoveryRecord) -> None: ...

    async def update_discovery(
        self, operation_id: str, metadata: dict[str, Any], *, final_revision: int, ended_at_ms: int | None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ScanAdmission:
    """An admitted scan: its spec, the provider that runs it, and the first answer its record keeps."""

    spec: SessionSpec
    provider: Provider
    reply: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionClaim:
    """One retained session's claim at one moment: what the operator's adapters page and the gauges show."""

    operation_id: str
    transport: str
    adapter: str  # the transport's default adapter when the scope named none
    claim_held: bool
    cleanup_uncertain: bool
    terminal_at_ms: int | None
    next_retry_ms: int | None  # when an uncertain cleanup is retried next


def _random_id() -> str:
    return opaque_id(secrets.token_bytes(16))


class DiscoveryManager:
    """Runs discovery sessions and keeps their in-memory state; `Operations` for the discovery kind."""

    kind: ClassVar[Kind] = "discovery"
    bindable: ClassVar[bool] = True

    def __init__(
        self,
        *,
        timer: Timer = WALL_TIMER,
        claims: ClaimRegistry | None = None,
        new_id: Callable[[], str] = _random_id,
        cleanup_retry_initial_s: float = 0.5,
        cleanup_retry_max_s: float = 30.0,
        metadata_retention_seconds: int = DEFAULT_METADATA_RETENTION_SECONDS,
        listener: SessionListener | None = None,
        journal: DiscoveryJournal | None = None,
    ) -> None:
        self._timer = timer
        self._listener = listener
        # When each uncertain cleanup is retried next (timer ms), for the operator's adapters page.
        self._next_retry_ms: dict[str, int] = {}
        self.claims = claims or ClaimRegistry()
        self._new_id = new_id
        self._retry_initial_ms = int(cleanup_retry_initial_s * 1000)
        self._retry_max_ms = int(cleanup_retry_max_s * 1000)
        self._metadata_retention_s = metadata_retention_seconds
        self._journal = journal
        self._sessions: dict[str, DiscoverySession] = {}
        # The candidates the latest status read of each operation showed, disclosed once it is delivered.
        self._shown: dict[str, frozenset[str]] = {}
        self._live = 0  # sessions whose runner has not ended
        self._due: list[tuple[int, int, str]] = []  # (when, tie-break, operation id) for the sweeper
        self._due_seq = 0
        self._sweeper_wake = anyio.Event()
        self._ended_listeners: list[Callable[[str, str], None]] = []
        self._forget_listeners: list[Callable[[str], None]] = []
        self._stack: AsyncExitStack | None = None
        self._task_group: TaskGroup | None = None
        self._closing = False

    # ---- lifetime ------------------------------------------------------------------------------------------

    async def __aenter__(self) -> DiscoveryManager:
        stack = AsyncExitStack()
        self._task_group = await stack.enter_async_context(anyio.create_task_group())
        self._stack = stack
        self._task_group.start_soon(self._sweep_forever)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        try:
            await self.aclose()
        finally:
            stack, self._stack = self._stack, None
            if stack is not None:
                # The body's own exception propagates as it is, not wrapped into the task group's.
                await stack.aclose()
        return None

    async def aclose(self) -> None:
        """Stop every live session with a bounded, confirmed stop; then drop background retries and timers."""
        self._closing = True
        live = [s for s in self._sessions.values() if not s.finished.is_set()]
        for session in live:
            session.terminate(INTERRUPTED_BY_RESTART, erase=True)
        # Each stop is bounded by its cleanup timeout; the extra second covers a start still in flight.
        bound_ms = max((s.spec.profile.cleanup_timeout_ms for s in live), default=0) + 1000
        # Shielded: a shutdown that is itself being cancelled still stops its provider sessions.
        with scope_after(self._timer, bound_ms, shield=True):
            for session in live:
                await session.finished.wait()
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()

    # ---- starting ------------------------------------------------------------------------------------------

    async def admit(self, admission: ScanAdmission) -> DiscoverySession:
        """Take the claim (or refuse before any provider call), record the scan, then start its runner.

        A scan this runtime already holds answers its session (nothing starts twice). With a journal, the
        durable row is written before the runner starts; when it cannot be, the claim goes and nothing runs.
        """
        spec, provider = admission.spec, admission.provider
        existing = self._sessions.get(spec.operation_id)
        if existing is not None:
            return existing
        self._require_open()
        adapter = await resolved_adapter(provider, spec.scope)  # once per session: the spec carries it
        existing = self._sessions.get(spec.operation_id)
        if existing is not None:  # the same operation was admitted while the adapter was being resolved
            return existing
        session = self._new_session(replace(spec, adapter=adapter), provider)
        try:
            await self._insert(session, admission.reply)
            self._require_open().start_soon(self._run, session)
        except BaseException:
            del self._sessions[spec.operation_id]
            self.claims.release(session.claim)
            raise
        self._live += 1
        return session

    def _new_session(self, spec: SessionSpec, provider: Provider) -> DiscoverySession:
        """Claim the (transport, adapter) and hold a pending session on it."""
        self._require_open()
        claim = self.claims.acquire(
            claim_key(spec.scope.transport, spec.adapter),
            operation_id=spec.operation_id,
            concurrent=provider.capabilities.concurrent_sessions,
            now_ms=spec.created_at_ms,
            expected_release_ms=spec.window_end_ms + spec.profile.cleanup_timeout_ms,
        )
        table = CandidateTable(spec.scope, spec.profile, generation=self._new_id(), new_ref=self._new_id)
        session = DiscoverySession(
            spec, provider=provider, table=table, claim=claim, timer=self._timer, listener=self._listener
        )
        self._sessions[spec.operation_id] = session
        return session

    async def _insert(self, session: DiscoverySession, reply: Mapping[str, Any]) -> None:
        """The scan's durable row, pending (shielded: a cancelled admission still knows whether it landed)."""
        if self._journal is None:
            return
        spec = session.spec
        record = DiscoveryRecord(
            operation_id=spec.operation_id,
            owner=spec.owner,
            action_id=spec.action_id,
            transport=spec.scope.transport,
            status=Status.PENDING.value,
            metadata=durable_metadata(session.view()),
            reply=dict(reply),
            causal_context=None if spec.causal_context is None else dict(spec.causal_context),
        )
        with anyio.CancelScope(shield=True):
            await self._journal.insert_discovery(record)

    def add_ended_listener(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Call `listener(operation_id, owner)` when a session's runner ended (terminal); returns an undo."""
        self._ended_listeners.append(listener)
        return lambda: self._ended_listeners.remove(listener)

    def add_forget_listener(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(operation_id)` when a session leaves memory; returns an undo."""
        self._forget_listeners.append(listener)
        return lambda: self._forget_listeners.remove(listener)

    def _end_live(self, session: DiscoverySession) -> None:
        self._live -= 1
        for listener in list(self._ended_listeners):
            listener(session.spec.operation_id, session.spec.owner)

    def _require_open(self) -> TaskGroup:
        if self._task_group is None or self._closing:
            raise SensoriumError("the discovery runtime is not running", code=Code.INTERNAL)
        return self._task_group

    async def _run(self, session: DiscoverySession) -> None:
        """Runner, then whatever the terminal status needs in the background."""
        if self._listener is not None:
            # Told here, once the record is durable and the 202 on its way: not on the admission's path.
            self._listener("admitted", session)
        try:
            await session.run()
        finally:
            self._end_live(session)
        if session.cleanup_uncertain:
            self.claims.postpone(session.claim, self._timer.now_ms() + self._retry_max_ms)
        else:
            self.claims.release(session.claim)
        await self._record(session)
        if session.cleanup_uncertain:
            await self._retry_cleanup(session)
        retention_ms = session.spec.profile.result_retention_seconds * 1000
        self._schedule(session, self._terminal_ms(session) + retention_ms)

    async def _retry_cleanup(self, session: DiscoverySession) -> None:
        """Retry the stop with bounded backoff until acknowledged; only then release the claim."""
        delay_ms = self._retry_initial_ms
        op_id = session.spec.operation_id
        try:
            while True:
                self._next_retry_ms[op_id] = self._timer.now_ms() + delay_ms
                await self._timer.sleep_until(self._next_retry_ms[op_id])
                result = await session.stop_provider()
                if result is not StopResult.UNCERTAIN:
                    self.claims.release(session.claim)
                    session.cleanup_confirmed_late(result)
                    await self._record(session)
                    return
                delay_ms = min(delay_ms * 2, self._retry_max_ms)
        finally:
            self._next_retry_ms.pop(op_id, None)

    async def _record(self, session: DiscoverySession) -> None:
        """Write the session's durable metadata to the journal (shielded: a shutdown still records it)."""
        if self._journal is None:
            return
        view = session.view()
        try:
            with anyio.CancelScope(shield=True):
                await self._journal.update_discovery(
                    session.spec.operation_id,
                    durable_metadata(view),
                    final_revision=view.final_revision,
                    ended_at_ms=session.terminal_at_ms,
                )
        except Exception as error:  # the type only: the journal must not take the runtime down
            _log.error("recording a discovery operation failed with %s", type(error).__name__)

    def _schedule(self, session: DiscoverySession, at_ms: int) -> None:
        """Hand a session to the retention sweeper."""
        self._due_seq += 1
        heapq.heappush(self._due, (at_ms, self._due_seq, session.spec.operation_id))
        if self._due[0][2] == session.spec.operation_id:
            self._sweeper_wake.set()

    async def _sweep_forever(self) -> None:
        """The one retention task: erase results that are due, forget sessions that are due."""
        while True:
            now = self._timer.now_ms()
            while self._due and self._due[0][0] <= now:
                _, _, operation_id = heapq.heappop(self._due)
                await self._retention_due(operation_id, now)
            self._sweeper_wake = anyio.Event()
            with self._timer.scope_until(self._due[0][0] if self._due else None):
                await self._sweeper_wake.wait()

    async def _retention_due(self, operation_id: str, now_ms: int) -> None:
        """Result retention ended: erase; then forget at once (journal) or at metadata retention."""
        session = self._sessions.get(operation_id)
        if session is None:
            return
        if session.erased_at_ms is None and session.status is Status.COMPLETED:
            session.erase_result()
            await self._record(session)
        forget_at = self._terminal_ms(session) + self._metadata_retention_s * 1000
        if self._journal is None and forget_at > now_ms:
            self._schedule(session, forget_at)
            return
        self._forget(operation_id)

    def _forget(self, operation_id: str) -> None:
        self._sessions.pop(operation_id, None)
        self._shown.pop(operation_id, None)
        for listener in list(self._forget_listeners):
            listener(operation_id)

    def _terminal_ms(self, session: DiscoverySession) -> int:
        return session.terminal_at_ms if session.terminal_at_ms is not None else self._timer.now_ms()

    # ---- reading -------------------------------------------------------------------------------------------

    def session(self, operation_id: str) -> DiscoverySession | None:
        """The session of an operation held in memory, else None."""
        return self._sessions.get(operation_id)

    def operation_ids(self) -> Iterator[str]:
        """Every operation this runtime still holds in memory."""
        return iter(list(self._sessions))

    def sessions(self) -> list[SessionClaim]:
        """The claim of every retained session, as it stands now (operator views, metrics)."""
        return [
            SessionClaim(
                operation_id=op_id,
                transport=session.spec.scope.transport,
                adapter=session.claim.key.adapter,
                claim_held=session.claim_state == "held",
                cleanup_uncertain=session.cleanup_uncertain,
                terminal_at_ms=session.terminal_at_ms,
                next_retry_ms=self._next_retry_ms.get(op_id),
            )
            for op_id, session in self._sessions.items()
        ]

    def active_count(self) -> int:
        """How many sessions have not ended yet (for metrics); kept as they start and end."""
        return self._live

    async def status(
        self, operation_id: str, *, after: int | None = None, wait_s: float = 0.0
    ) -> dict[str, Any] | None:
        """The caller-private v2 status; with `wait_s`, once past revision `after` (or terminal) or then.

        A read: the edge that delivers it says what was disclosed (`mark_disclosed`).
        """
        session = self._sessions.get(operation_id)
        if session is None:
            return None
        if wait_s > 0:
            threshold = session.delivered_revision if after is None else after
            with scope_after(self._timer, wait_s * 1000):
                # A revision the caller cannot see (cancel requested, result erased) never ends the wait.
                while not session.is_terminal and session.delivered_revision <= threshold:
                    await session.changed.wait()
        return self._shown_status(session)

    def mark_disclosed(self, operation_id: str) -> None:
        """The last status read of the operation was delivered: the candidates it carried are disclosed."""
        session = self._sessions.get(operation_id)
        if session is not None:
            session.disclosed.update(self._shown.pop(operation_id, ()))

    def _shown_status(self, session: DiscoverySession) -> dict[str, Any]:
        """The caller-private status, remembering which candidates it shows until it is delivered."""
        view = session.view()
        self._shown[session.spec.operation_id] = disclosed_refs(view)
        return caller_status_v2(view)

    async def observe(self, operation_id: str) -> Observed | None:
        """The CONTRACT §7 projection: no candidates, refs, labels or identity selectors."""
        session = self._sessions.get(operation_id)
        if session is None:
            return None
        metadata = durable_metadata(session.view())
        return Observed(str(metadata["status"]), metadata)

    # ---- ending --------------------------------------------------------------------------------------------

    async def cancel(self, operation_id: str) -> tuple[bool, dict[str, Any]] | None:
        """Request confirmed termination (the stop begins, its end is not awaited); whether the request
        changed anything, and the status after it (unchanged when terminal)."""
        session = self._sessions.get(operation_id)
        if session is None:
            return None
        changed = session.request_cancel()
        return changed, self._shown_status(session)

    async def stop(self, operation_id: str, error_code: str) -> None:
        """End an operation `failed` with `error_code` (e.g. `response-too-large`); cleanup per §6.7."""
        session = self._sessions.get(operation_id)
        if session is not None:
            session.terminate(error_code, erase=True)

    def revoke_owner(self, owner: str, *, action_id: str | None = None) -> list[str]:
        """End the live sessions of `owner` (`grant-revoked`), erase its retained results (per action)."""
        ended = []
        for session in list(self._sessions.values()):
            mine = session.spec.owner == owner and action_id in (None, session.spec.action_id)
            if not mine:
                continue
            if session.terminate(Code.GRANT_REVOKED, erase=True):
                ended.append(session.spec.operation_id)
            elif session.status is Status.COMPLETED:
                # A retained result is candidate data too: a revocation invalidates it at once.
                session.erase_result()
        return ended


async def resolved_adapter(provider: Provider, scope: DiscoveryScope) -> str | None:
    """The adapter the claim is keyed by: the provider's resolution when it has one, else the named one."""
    resolve = getattr(provider, "resolve_adapter", None)
    if resolve is None:
        return scope.adapter
    adapter: str | None = await resolve(scope)
    return adapter
