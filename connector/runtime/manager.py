"""The discovery runtime: runs admitted scans as sessions, answers their statuses, cleans up behind them.

`DiscoveryManager` owns one anyio task group (`async with`). Each session gets a runner task; a session
whose stop was not acknowledged keeps retrying in that task, holding the claim until a late
acknowledgement, whatever happened to its caller. One retention sweeper (not a task per operation) erases
completed results after `result_retention_seconds`; with a journal (the connector's durable state) the
session then leaves memory and its status is answered from the durable record, so the sessions held are
the live and the recently ended ones only. Every lifecycle change of a session is recorded in the journal
before anyone is told of it; live sessions are counted per owner as they start and end, never scanned.
"""

from __future__ import annotations

import heapq
import logging
import math
import secrets
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from dataclasses import replace
from types import TracebackType
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup

from connector.core.admission import SessionSpec
from connector.core.clock import wall_clock_ms
from connector.core.endings import StopResult
from connector.core.ids import opaque_id
from connector.core.lifecycle import INTERRUPTED_BY_RESTART, Status
from connector.core.projections import caller_status_v2, durable_metadata
from connector.core.scope import DiscoveryScope
from connector.core.snapshot import CandidateTable
from connector.errors import SensoriumError
from connector.runtime.claims import ClaimRegistry, claim_key
from connector.runtime.session import DiscoverySession, SessionHandle, SessionListener
from providers.base import Provider

DEFAULT_METADATA_RETENTION_SECONDS = 7 * 24 * 3600
_log = logging.getLogger("sensorium.discovery")


class SessionJournal(Protocol):
    """Where lifecycle changes of sessions go (`connector.storage.state.ConnectorState`): durable metadata."""

    async def update_discovery(
        self, operation_id: str, metadata: dict[str, Any], *, final_revision: int, ended_at_ms: int | None
    ) -> None: ...


class UnknownOperation(SensoriumError):
    """An operation this connector never saw or no longer retains."""

    default_code = "unknown-operation"


def _random_id() -> str:
    return opaque_id(secrets.token_bytes(16))


class DiscoveryManager:
    """Runs discovery sessions and keeps their in-memory state (never persisted)."""

    def __init__(
        self,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        claims: ClaimRegistry | None = None,
        new_id: Callable[[], str] = _random_id,
        cleanup_retry_initial_s: float = 0.5,
        cleanup_retry_max_s: float = 30.0,
        metadata_retention_seconds: int = DEFAULT_METADATA_RETENTION_SECONDS,
        listener: SessionListener | None = None,
        journal: SessionJournal | None = None,
    ) -> None:
        self._clock = clock
        self._listener = listener
        # When each uncertain cleanup is retried next (wall-clock ms), for the operator's adapters page.
        self._next_retry_ms: dict[str, int] = {}
        self.claims = claims or ClaimRegistry()
        self._new_id = new_id
        self._retry_initial_s = cleanup_retry_initial_s
        self._retry_max_s = cleanup_retry_max_s
        self._metadata_retention_s = metadata_retention_seconds
        self._journal = journal
        self._sessions: dict[str, DiscoverySession] = {}
        self._live: Counter[str] = Counter()  # owner -> sessions whose runner has not ended
        self._launched: set[str] = set()
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
        with anyio.move_on_after(bound_ms / 1000.0, shield=True):
            for session in live:
                await session.finished.wait()
        if self._task_group is not None:
            self._task_group.cancel_scope.cancel()

    # ---- starting ------------------------------------------------------------------------------------------

    async def start_scan(self, spec: SessionSpec, provider: Provider) -> SessionHandle:
        """Take the claim (or refuse before any provider call) and start the session's runner."""
        handle = await self.prepare_scan(spec, provider)
        self.launch(spec.operation_id)
        return handle

    async def prepare_scan(self, spec: SessionSpec, provider: Provider) -> SessionHandle:
        """Take the claim (or refuse) and register the session, pending; `launch` starts its runner."""
        operation_id = spec.operation_id
        existing = self._sessions.get(operation_id)
        if existing is not None:
            return SessionHandle(existing)
        self._require_open()
        adapter = await resolved_adapter(provider, spec.scope)
        existing = self._sessions.get(operation_id)
        if existing is not None:  # the same operation was started while the adapter was being resolved
            return SessionHandle(existing)
        self._require_open()
        claim = self.claims.acquire(
            claim_key(spec.scope.transport, adapter),
            operation_id=operation_id,
            concurrent=provider.capabilities.concurrent_sessions,
            now_ms=spec.created_at_ms,
            expected_release_ms=spec.window_end_ms + spec.profile.cleanup_timeout_ms,
        )
        spec = replace(spec, adapter=adapter)
        table = CandidateTable(spec.scope, spec.profile, generation=self._new_id(), new_ref=self._new_id)
        session = DiscoverySession(
            spec, provider=provider, table=table, claim=claim, clock=self._clock, listener=self._listener
        )
        self._sessions[operation_id] = session
        self._live[spec.owner] += 1
        return SessionHandle(session)

    def launch(self, operation_id: str) -> None:
        """Start the runner of a prepared session (once its record is durable)."""
        if operation_id in self._launched:
            return
        task_group = self._require_open()
        self._launched.add(operation_id)
        task_group.start_soon(self._run, self._get(operation_id))

    def abandon(self, operation_id: str) -> None:
        """Undo a prepared session that was never launched (its admission failed): claim and count go."""
        session = self._sessions.get(operation_id)
        if session is None or operation_id in self._launched:
            return
        del self._sessions[operation_id]
        self.claims.release(session.claim)
        self._end_live(session)

    def add_ended_listener(self, listener: Callable[[str, str], None]) -> Callable[[], None]:
        """Call `listener(operation_id, owner)` when a session's runner ended (terminal); returns an undo."""
        self._ended_listeners.append(listener)
        return lambda: self._ended_listeners.remove(listener)

    def add_forget_listener(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call `listener(operation_id)` when a session leaves memory; returns an undo."""
        self._forget_listeners.append(listener)
        return lambda: self._forget_listeners.remove(listener)

    def _end_live(self, session: DiscoverySession) -> None:
        owner = session.spec.owner
        self._live[owner] -= 1
        if self._live[owner] <= 0:
            del self._live[owner]
        for listener in list(self._ended_listeners):
            listener(session.spec.operation_id, owner)

    def _require_open(self) -> TaskGroup:
        if self._task_group is None or self._closing:
            raise SensoriumError("the discovery runtime is not running", code="internal")
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
            self.claims.postpone(session.claim, self._clock() + int(self._retry_max_s * 1000))
        else:
            self.claims.release(session.claim)
        await self._record(session)
        if session.cleanup_uncertain:
            await self._retry_cleanup(session)
        retention_ms = session.spec.profile.result_retention_seconds * 1000
        self._schedule(session, self._terminal_ms(session) + retention_ms)

    async def _retry_cleanup(self, session: DiscoverySession) -> None:
        """Retry the stop with bounded backoff until acknowledged; only then release the claim."""
        delay = self._retry_initial_s
        op_id = session.spec.operation_id
        try:
            while True:
                self._next_retry_ms[op_id] = self._clock() + int(delay * 1000)
                await anyio.sleep(delay)
                result = await session.stop_provider()
                if result is not StopResult.UNCERTAIN:
                    self.claims.release(session.claim)
                    session.cleanup_confirmed_late(result)
                    await self._record(session)
                    return
                delay = min(delay * 2, self._retry_max_s)
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
            now = self._clock()
            while self._due and self._due[0][0] <= now:
                _, _, operation_id = heapq.heappop(self._due)
                await self._retention_due(operation_id, now)
            self._sweeper_wake = anyio.Event()
            wait_s = math.inf if not self._due else max(0.0, (self._due[0][0] - now) / 1000.0)
            with anyio.move_on_after(wait_s):
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
        self._launched.discard(operation_id)
        for listener in list(self._forget_listeners):
            listener(operation_id)

    def _terminal_ms(self, session: DiscoverySession) -> int:
        return session.terminal_at_ms if session.terminal_at_ms is not None else self._clock()

    # ---- reading -------------------------------------------------------------------------------------------

    def _get(self, operation_id: str) -> DiscoverySession:
        session = self._sessions.get(operation_id)
        if session is None:
            raise UnknownOperation("unknown operation")
        return session

    def handle(self, operation_id: str) -> SessionHandle:
        """A read-only handle on a known operation."""
        return SessionHandle(self._get(operation_id))

    def find(self, operation_id: str) -> SessionHandle | None:
        """A read-only handle on an operation held in memory, else None."""
        session = self._sessions.get(operation_id)
        return None if session is None else SessionHandle(session)

    def operation_ids(self) -> Iterator[str]:
        """Every operation this runtime still holds in memory."""
        return iter(list(self._sessions))

    def sessions(self) -> list[SessionHandle]:
        """Read-only handles on every retained session (operator views, metrics)."""
        return [SessionHandle(session) for session in self._sessions.values()]

    def next_cleanup_retry_ms(self, operation_id: str) -> int | None:
        """When an uncertain cleanup is retried next, if one is being retried."""
        return self._next_retry_ms.get(operation_id)

    def active_count(self) -> int:
        """How many sessions have not ended yet (for metrics); kept as they start and end."""
        return sum(self._live.values())

    def active_operations(self, owner: str) -> int:
        """How many sessions of `owner` have not ended yet; kept as they start and end."""
        return self._live.get(owner, 0)

    def status(self, operation_id: str) -> dict[str, Any]:
        """The caller-private v2 status (a read: `mark_disclosed` counts what reaches a caller)."""
        return caller_status_v2(self._get(operation_id).view())

    def mark_disclosed(self, operation_id: str, document: Mapping[str, Any]) -> None:
        """A status was delivered to its caller: every candidate it carries counts as disclosed.

        Nothing to count when the runtime does not hold the operation (a command, or a scan answered from
        its durable record, which carries no candidates).
        """
        session = self._sessions.get(operation_id)
        if session is not None:
            session.disclosed.update(_candidate_refs(document))

    def metadata(self, operation_id: str) -> dict[str, Any]:
        """The durable projection (CONTRACT §7): no candidates, refs, labels or identity selectors."""
        return durable_metadata(self._get(operation_id).view())

    async def wait_for_change(
        self, operation_id: str, after_revision: int | None, timeout_s: float
    ) -> dict[str, Any]:
        """Long poll: the status once past `after_revision` or terminal, else when `timeout_s` ran out."""
        session = self._get(operation_id)
        threshold = session.delivered_revision if after_revision is None else after_revision
        with anyio.move_on_after(max(0.0, timeout_s)):
            # A revision the caller cannot see (cancel requested, result erased) never ends the wait.
            while not session.is_terminal and session.delivered_revision <= threshold:
                await session.changed.wait()
        return self.status(operation_id)

    # ---- ending --------------------------------------------------------------------------------------------

    def cancel(self, operation_id: str) -> dict[str, Any]:
        """Request confirmed termination; the status after the request (unchanged when terminal)."""
        self._get(operation_id).request_cancel()
        return self.status(operation_id)

    def terminate(self, operation_id: str, *, error_code: str, erase: bool = True) -> None:
        """End an operation `failed` with `error_code` (e.g. `grant-revoked`, `response-too-large`)."""
        self._get(operation_id).terminate(error_code, erase=erase)

    def revoke_owner(self, owner: str, *, action_id: str | None = None) -> list[str]:
        """End the live sessions of `owner` (`grant-revoked`), erase its retained results (per action)."""
        ended = []
        for session in list(self._sessions.values()):
            mine = session.spec.owner == owner and action_id in (None, session.spec.action_id)
            if not mine:
                continue
            if session.terminate("grant-revoked", erase=True):
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


def _candidate_refs(document: Mapping[str, Any]) -> Iterator[str]:
    """Refs of the candidates a status document carries (progress snapshot and result)."""
    progress = document.get("progress") or {}
    result = document.get("result") or {}
    for candidate in (progress.get("snapshot") or {}).get("candidates", ()):
        yield candidate["candidate/ref"]
    for candidate in result.get("candidates", ()):
        yield candidate["candidate/ref"]
