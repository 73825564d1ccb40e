"""The reference host (CONTRACT §3, 7, 11): admits through the host policy, records durably, polls, answers.

Rules of this file:
- the registry row is committed before a 202 leaves; an idempotent repeat answers the first handle;
- an operation already over when the host first looks (a window cut to zero, a command that ended during
  admission) is recorded `pending`, as its handle says, and concluded by the poll's own path: its history
  holds both, nothing stays due, and the terminal listeners (op.done, continuation) fire once;
- each edge authenticates once (`authenticate`) and hands the principal down; every read, poll and cancel by
  a caller re-checks its ownership of the row and its current grant; anything else is `unknown-operation`,
  exactly like an id nobody ever saw;
- what is recorded is durable metadata (CONTRACT §7) only; the caller-private status is fetched live, shaped
  with the host's policy fields and handed to the caller, never stored;
- a status larger than `max_response_bytes` is not sent: the operation ends `failed` `response-too-large`;
- an operation not terminal at `expires_at`, or after `max_attempts` host polls, ends `expired` and the
  connector is told to stop the work; a connector that no longer knows an operation makes it `unknown`;
- cancel is bridged only where the handle has a `cancel_href`; otherwise 409 `not-cancelable` with the
  recorded reason;
- "attempts" are the host's own polls (poller and operator poll-now); a caller's reads are live fetches that
  move the next poll back but never use up `max_attempts`;
- after retention the registry forgets an operation: its id then answers exactly like one never seen
  (404 `unknown-operation` over HTTP, `unknown` on the Bus).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from connector.contract.canonical import sha256_hex
from connector.core import authority
from connector.core.admission import Identified, caller_deadline
from connector.core.clock import from_ms, wall_clock
from connector.core.ids import OPERATION_KIND
from connector.core.lifecycle import IllegalTransition, Status, is_terminal
from connector.core.operator_rows import (
    DEFAULT_PAGE,
    MAX_PAGE,
    BadCursor,
    connector_row,
    decode_cursor,
    error_code_of,
    merge_rows,
    operator_page,
)
from connector.core.policy import DeferredHostPolicy
from connector.errors import Code, SensoriumError, unknown_operation
from connector.host import documents
from connector.host.continuations import ContinuationStore
from connector.host.documents import kind_of, rules_of
from connector.host.metrics import HostMetrics
from connector.host.port import ActionInfo, ConnectorPort, InProcessConnector
from connector.host.receipts import record_receipt
from connector.runtime.operations import Kind, Observed
from connector.service.answers import Accepted, Done
from connector.service.connector import ConnectorService
from connector.service.operations import ConnectorOperations, LiveConnectorOperations
from connector.storage.registry import DEFAULT_RETENTION, DeferredRegistry, OperationRecord

_log = logging.getLogger("sensorium.host")
_STATUSES = frozenset(s.value for s in Status)
Spawn = Callable[[Callable[[], Awaitable[None]]], None]


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel answered: whether it changed anything, and the status after it."""

    changed: bool
    answer: Done


def system_jitter() -> float:
    """A uniform draw in [0, 1) for the retry jitter."""
    return secrets.randbelow(1 << 30) / (1 << 30)


class HostService:
    """The host side of deferred operations, in the same process as its connector."""

    def __init__(
        self,
        connector: ConnectorService | ConnectorPort,
        registry: DeferredRegistry,
        policy: DeferredHostPolicy,
        clock: Callable[[], datetime] = wall_clock,
        jitter: Callable[[], float] = system_jitter,
        *,
        metrics: HostMetrics | None = None,
        retention: timedelta = DEFAULT_RETENTION,
        owner_module_id: str = documents.OWNER_MODULE_ID,
        operations: ConnectorOperations | None = None,
    ) -> None:
        self.port: ConnectorPort = (
            InProcessConnector(connector) if isinstance(connector, ConnectorService) else connector
        )
        self.registry = registry
        if operations is None and isinstance(connector, ConnectorService):
            operations = LiveConnectorOperations(connector.discovery, connector.state)
        # The connector's own operations (admitted on its routes): listed and cancelled beside the registry's.
        self.operations = operations
        self.policy = policy
        self.clock = clock
        self._jitter = jitter
        self.metrics = metrics or HostMetrics()
        self.retention = retention
        self.owner_module_id = owner_module_id
        self.continuations = ContinuationStore(registry, self._completed_result, self.metrics)
        self.interrupted: list[OperationRecord] = []
        self.on_admitted: Callable[[], None] | None = None
        self.spawn: Spawn | None = None
        self._undo_listener = registry.add_terminal_listener(self._on_terminal)

    def close(self) -> None:
        """Stop listening to the registry."""
        self._undo_listener()

    def authenticate(self, token: str | None) -> authority.Principal:
        """The principal behind a bearer token (CONTRACT §2 step 1): each edge asks once per request."""
        return self.port.authenticate(token)

    # ---- admission -----------------------------------------------------------------------------------------

    def identify(self, principal: authority.Principal, directive: Any, *, bus_op: str | None) -> Identified:
        """For the Bus's `op.start`: admission steps 2-3, the Bus's operations-only rule and the keyed id,
        run once (hand the answer to `admit`)."""
        return self.port.identify(principal, directive, op_key=bus_op, operations_only=True)

    async def admit(
        self,
        principal: authority.Principal,
        directive: Any,
        *,
        bus_op: str | None = None,
        identified: Identified | None = None,
    ) -> Accepted | Done:
        """POST /v1/host/directives: connector admission, then the host handle (202) or the sync answer."""
        # Every repeat goes through the connector's full admission (steps 2-8, issue D6); the connector
        # answers a keyed repeat of ended or restart-cut work from its durable record and starts nothing,
        # and `_accept` then answers the host's recorded handle.
        answer = await self.port.admit(principal, directive, op_key=bus_op, identified=identified)
        if not isinstance(answer, Accepted):
            return answer
        return await self._accept(principal, directive, answer.handle, bus_op)

    async def _accept(
        self,
        principal: authority.Principal,
        directive: Mapping[str, Any],
        connector_handle: Mapping[str, Any],
        bus_op: str | None,
    ) -> Accepted:
        op_id = connector_handle["connector_operation/id"]
        existing = await self.registry.get(op_id)
        if existing is not None:
            return _accepted_handle(existing)
        record, observed = await self._new_record(principal, directive, connector_handle, bus_op)
        try:
            inserted = await self.registry.record_accepted(record)
        except Exception:
            # No durable row, no work: the connector is told to stop before the refusal leaves.
            await self.port.stop(op_id, kind_of(record), Code.INTERNAL)
            raise
        if not inserted:
            known = await self.registry.get(op_id)
            return _accepted_handle(known if known is not None else record)
        if self.on_admitted is not None:
            self.on_admitted()
        if observed is not None and observed.status != record.status:
            # It ended during admission (CONTRACT §11): concluded exactly as a poll that sees the end.
            await self._settle_observation(record, observed, self.clock(), attempts=None)
        return _accepted_handle(record)

    async def _new_record(
        self,
        principal: authority.Principal,
        directive: Mapping[str, Any],
        connector_handle: Mapping[str, Any],
        bus_op: str | None,
    ) -> tuple[OperationRecord, Observed | None]:
        """The accepted row at the first status seen, unless that one is terminal: then at `pending` (what
        the handle says), and the observation goes through the poll's conclusion (`_settle_observation`)."""
        now = self.clock()
        op_id = connector_handle["connector_operation/id"]
        action = self._action(connector_handle["action_id"])
        retry = self.policy.effective_retry_after(connector_handle["retry_after_seconds"], self._jitter())
        expires_at = self.policy.effective_expires_at(
            now,
            connector_fail_after=connector_handle.get("fail_after_seconds"),
            preferred_max_ttl=action.preferred_max_ttl_seconds,
            caller_deadline=caller_deadline(directive),
        )
        handle = documents.deferred_handle(
            connector_handle,
            directive,
            created_at=now,
            expires_at=expires_at,
            retry_after_seconds=retry,
            owner_module_id=self.owner_module_id,
        )
        observed = await self.port.observe(op_id, action.kind)
        metadata: dict[str, Any] = {"operation/id": op_id, "status": Status.PENDING.value}
        if observed is not None and not is_terminal(Status(observed.status)):
            metadata = dict(observed.metadata)
        diagnostics = handle["diagnostics"]
        record = OperationRecord(
            operation_id=op_id,
            operation_kind=OPERATION_KIND,
            owner_module_id=self.owner_module_id,
            capability_id=action.action_id,
            owner=principal.principal_id,
            status=Status(metadata.get("status", Status.PENDING.value)).value,
            retry_after_seconds=retry,
            next_poll_at=min(now + timedelta(seconds=retry), expires_at),
            expires_at=expires_at,
            attempts=0,
            cancelable="cancel_href" in handle,
            cancel_unavailable_reason=handle.get("cancel/unavailable-reason"),
            correlation_id=directive.get("correlation/id"),
            continuation_digest=None,
            diagnostics_digest=sha256_hex(diagnostics) if diagnostics else None,
            last_error=None,
            created_at=now,
            updated_at=now,
            bus_op=bus_op,
            metadata=metadata,
            causal_context=directive.get("causal/context"),
            handle=handle,
        )
        return record, observed

    def _action(self, action_id: str) -> ActionInfo:
        action = self.port.action(action_id)
        if action is None:
            raise SensoriumError("the action left the catalog", code=Code.INTERNAL)
        return action

    # ---- the owning caller ---------------------------------------------------------------------------------

    async def status(
        self,
        principal: authority.Principal,
        op_id: str,
        *,
        wait_seconds: float | None = None,
        after_revision: int | None = None,
    ) -> Done:
        """GET /v1/host/operations/{id}: the connector's status live, with the host's policy fields."""
        record = await self._visible(principal, op_id)
        document = await self.port.caller_status(
            op_id, kind_of(record), wait_seconds=wait_seconds, after_revision=after_revision
        )
        return Done(await self._answer(record, document))

    async def cancel(self, principal: authority.Principal, op_id: str) -> Done:
        """POST /v1/host/operations/{id}/cancel: bridged only where the handle has a `cancel_href`."""
        return (await self.cancel_visible(await self._visible(principal, op_id))).answer

    async def cancel_visible(self, record: OperationRecord) -> Cancelled:
        """The cancel of a row its caller may see (checked by the edge that found it, e.g. the Bus by its
        handle): the status after the request, and whether the request changed anything (the runtime's)."""
        op_id, kind = record.operation_id, kind_of(record)
        changed, document = False, None
        if record.terminal:
            document = await self.port.caller_status(op_id, kind, wait_seconds=None, after_revision=None)
        else:
            _require_cancelable(record)
            changed, document = await self.port.cancel(op_id, kind) or (False, None)
        return Cancelled(changed, Done(await self._answer(record, document)))

    async def _visible(self, principal: authority.Principal, op_id: str) -> OperationRecord:
        record = await self.registry.get(op_id)
        if record is None or not authority.may_see(
            principal, record.owner, record.capability_id, documents.transport_of(record)
        ):
            raise unknown_operation()
        return record

    async def _answer(self, record: OperationRecord, document: Mapping[str, Any] | None) -> dict[str, Any]:
        """Record what the live status says, then shape it for the caller (or build the host's own)."""
        now = self.clock()
        if document is None:
            if not record.terminal:
                record = await self._conclude(record, Status.UNKNOWN, None, now)
            return documents.record_document(record)
        status = Status(document["status"])
        if record.terminal and status.value != record.status:
            return documents.record_document(record)
        if not record.terminal and not is_terminal(status) and now >= record.expires_at:
            return documents.record_document(await self._expire(record, record.metadata, now))
        if not self.policy.status_fits(document):
            return await self._too_large(record, now)
        observed = await self.port.observe(record.operation_id, kind_of(record))
        retry = None if is_terminal(status) else self._retry(record, document.get("retry_after_seconds"))
        record = await self._record(record, observed, now, retry, attempts=None)
        return documents.with_policy_fields(document, record, retry)

    async def _too_large(self, record: OperationRecord, now: datetime) -> dict[str, Any]:
        if record.terminal:
            return documents.record_document(record, diagnostics=[documents.coded(Code.RESPONSE_TOO_LARGE)])
        await self.port.stop(record.operation_id, kind_of(record), Code.RESPONSE_TOO_LARGE)
        record = await self._conclude(record, Status.FAILED, Code.RESPONSE_TOO_LARGE, now)
        return documents.record_document(record)

    # ---- polling (the poller and operators) ----------------------------------------------------------------

    async def poll(self, record: OperationRecord, now: datetime | None = None) -> OperationRecord:
        """One host poll through the connector: record the change, expire, or mark unknown."""
        if record.terminal:
            return record
        now = now or self.clock()
        attempts = record.attempts + 1
        self.metrics.polls.inc()
        try:
            observed = await self.port.observe(record.operation_id, kind_of(record))
            return await self._settle_observation(record, observed, now, attempts=attempts)
        except Exception as error:  # one failing poll must not stop the others; type name only
            self.metrics.errors.inc()
            _log.error("host poll failed with %s", type(error).__name__)
            return await self._reschedule_after_error(record, now, attempts)

    async def _settle_observation(
        self, record: OperationRecord, observed: Observed | None, now: datetime, *, attempts: int | None
    ) -> OperationRecord:
        """What the connector reports, recorded once: a poll's, or the first one at admission."""
        try:
            return await self._after_poll(record, observed, now, attempts)
        except IllegalTransition:
            current = await self.registry.get(record.operation_id)  # another poller concluded it first
            return current if current is not None else record

    async def _after_poll(
        self, record: OperationRecord, observed: Observed | None, now: datetime, attempts: int | None
    ) -> OperationRecord:
        if observed is None:
            return await self._conclude(record, Status.UNKNOWN, None, now, attempts=attempts)
        if is_terminal(Status(observed.status)):
            document = observed.document
            if document is not None and not self.policy.status_fits(document):
                too_large = Code.RESPONSE_TOO_LARGE
                return await self._conclude(record, Status.FAILED, too_large, now, attempts=attempts)
            return await self._record(record, observed, now, None, attempts=attempts)
        polls = record.attempts if attempts is None else attempts
        if now >= record.expires_at or self.policy.attempts_exhausted(polls):
            return await self._expire(record, observed.metadata, now, attempts=attempts)
        retry = self._retry(record, observed.retry_hint)
        return await self._record(record, observed, now, retry, attempts=attempts)

    async def _reschedule_after_error(
        self, record: OperationRecord, now: datetime, attempts: int
    ) -> OperationRecord:
        retry = self._retry(record, None)
        return await self.registry.record_status(
            record.operation_id,
            status=record.status,
            metadata=record.metadata,
            now=now,
            retry_after_seconds=retry,
            next_poll_at=self._next_poll(record, now, retry),
            attempts=attempts,
            last_error=Code.INTERNAL,
        )

    async def _record(
        self,
        record: OperationRecord,
        observed: Observed | None,
        now: datetime,
        retry: int | None,
        *,
        attempts: int | None,
    ) -> OperationRecord:
        """Store the observed status and durable metadata (the row keeps its own when nothing was seen)."""
        status = observed.status if observed else record.status
        metadata = observed.metadata if observed else record.metadata
        if record.terminal and status != record.status:
            return record
        terminal = is_terminal(Status(status))
        return await self.registry.record_status(
            record.operation_id,
            status=status,
            metadata=metadata,
            now=now,
            retry_after_seconds=None if terminal else retry,
            next_poll_at=None if terminal or retry is None else self._next_poll(record, now, retry),
            attempts=attempts,
            last_error=error_code_of(metadata) if terminal else None,
        )

    async def _expire(
        self,
        record: OperationRecord,
        metadata: Mapping[str, Any],
        now: datetime,
        *,
        attempts: int | None = None,
    ) -> OperationRecord:
        """End `expired` and tell the connector to stop the work (in the background when possible)."""
        self.metrics.expirations.inc()
        await self._stop_work(record.operation_id, kind_of(record), Code.DEADLINE_EXCEEDED)
        fresh = record if metadata is record.metadata else _with_metadata(record, metadata)
        return await self._conclude(fresh, Status.EXPIRED, Code.DEADLINE_EXCEEDED, now, attempts=attempts)

    async def _stop_work(self, op_id: str, kind: Kind, code: str) -> None:
        if documents.KIND_RULES[kind].stop_waits and self.spawn is not None:
            self.spawn(lambda: self._stop_quietly(op_id, kind, code))
            return
        await self._stop_quietly(op_id, kind, code)

    async def _stop_quietly(self, op_id: str, kind: Kind, code: str) -> None:
        try:
            await self.port.stop(op_id, kind, code)
        except Exception as error:
            self.metrics.errors.inc()
            _log.error("stopping host-ended work failed with %s", type(error).__name__)

    async def _conclude(
        self,
        record: OperationRecord,
        status: Status,
        error_code: str | None,
        now: datetime,
        *,
        attempts: int | None = None,
    ) -> OperationRecord:
        """An end the host decided (expired, unknown, response-too-large), from durable metadata."""
        metadata = documents.concluded_metadata(record.metadata, status, error_code, rules_of(record))
        return await self.registry.record_status(
            record.operation_id,
            status=status.value,
            metadata=metadata,
            now=now,
            retry_after_seconds=None,
            next_poll_at=None,
            attempts=attempts,
            last_error=error_code,
        )

    def _retry(self, record: OperationRecord, hint: Any) -> int:
        """The connector's hint (else the action's), clamped and jittered by the host policy."""
        if not isinstance(hint, int) or isinstance(hint, bool):
            action = self.port.action(record.capability_id)
            hint = action.retry_after_seconds if action is not None else self.policy.min_retry_after_seconds
        return self.policy.effective_retry_after(hint, self._jitter())

    def _next_poll(self, record: OperationRecord, now: datetime, retry: int) -> datetime:
        return min(now + timedelta(seconds=retry), record.expires_at)

    async def poll_due(self, now: datetime | None = None, *, limit: int = 1000) -> int:
        """Poll every operation whose next poll is due; returns how many were polled."""
        now = now or self.clock()
        due = await self.registry.due(now, limit)
        for record in due:
            await self.poll(record, now)
        self.metrics.active.set(await self.registry.count_active())
        return len(due)

    async def purge(self, now: datetime | None = None) -> int:
        """Retention: forget terminal metadata older than `retention` (the id then answers unknown)."""
        return await self.registry.purge_terminal_before((now or self.clock()) - self.retention)

    # ---- restart -------------------------------------------------------------------------------------------

    async def recover(self, now: datetime | None = None) -> list[OperationRecord]:
        """At start: discovery work is interrupted, command ends are mirrored; returns what the restart ended.

        Discovery rows are marked without listeners (nothing is connected yet); mirrored command statuses go
        through the usual recording, listeners included. Flows waiting on any ended operation are settled.
        """
        now = now or self.clock()
        open_rows = await self._non_terminal()
        interrupted = {r.capability_id for r in open_rows if not rules_of(r).survives_restart}
        marked = await self.registry.mark_interrupted(now, capability_ids=interrupted) if interrupted else []
        for record in marked:
            self.metrics.terminal.labels(record.status).inc()
        mirrored = []
        for record in open_rows:
            if rules_of(record).survives_restart:
                ended = await self.poll(record, now)
                if ended.last_error == Code.INTERRUPTED_BY_RESTART:
                    mirrored.append(ended)
        self.interrupted = [*marked, *mirrored]
        await self.continuations.settle_pending()
        return self.interrupted

    async def _non_terminal(self) -> list[OperationRecord]:
        rows = []
        for status in (Status.PENDING, Status.RUNNING):
            rows += await self.registry.list(status=status.value, limit=1_000_000)
        return rows

    async def _on_terminal(self, record: OperationRecord) -> None:
        self.metrics.terminal.labels(record.status).inc()
        await self.continuations.settle(record)

    async def _completed_result(self, record: OperationRecord) -> Any:
        """The `result` of a completed operation, live from the connector (None when it is gone)."""
        document = await self.port.caller_status(
            record.operation_id, kind_of(record), wait_seconds=None, after_revision=None
        )
        if document is None or document.get("status") != Status.COMPLETED:
            return None
        return document.get("result")

    # ---- operators -----------------------------------------------------------------------------------------

    async def operator_list(
        self,
        operator: authority.Principal,
        status: str | None = None,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PAGE,
    ) -> Done:
        """GET /v1/admin/deferred-operations: every operation the process knows, newest first, a page at a
        time (CONTRACT §9). The HTTP admin list, the console and the Bus `admin.list` all call this."""
        authority.require_operator(operator)
        if status is not None and status not in _STATUSES:
            raise _invalid_query("status", "unknown-status")
        try:
            before = decode_cursor(after) if after is not None else None
            start = None if before is None else (from_ms(before[0]), before[1])
        except (BadCursor, ValueError):
            raise _invalid_query("after", "unknown-cursor") from None
        if not 1 <= limit <= MAX_PAGE:
            raise _invalid_query("limit", "out-of-range")
        records = await self.registry.newest(status=status, before=start, limit=limit + 1)
        host_rows = [documents.durable_view(r) for r in records]
        rows = merge_rows(host_rows, await self._connector_rows(await self.registry.known_ids()))
        page = operator_page(rows, status=status, after=after, limit=limit)
        document: dict[str, Any] = {"operations": list(page.rows)}
        if page.next_after is not None:
            document["next_after"] = page.next_after
        return Done(document)

    async def operator_detail(self, operator: authority.Principal, op_id: str) -> Done:
        """GET /v1/admin/deferred-operations/{id}: durable view, history digests, receipt."""
        authority.require_operator(operator)
        record = await self.registry.get(op_id)
        if record is None:
            return Done(await self._connector_detail(op_id))
        return Done(await self._detail(record))

    async def operator_poll(self, operator: authority.Principal, op_id: str) -> Done:
        """POST /v1/admin/deferred-operations/{id}/poll: poll now, then the detail."""
        authority.require_operator(operator)
        record = await self.registry.get(op_id)
        if record is None:  # the connector's own: its metadata is live, there is nothing to poll
            return Done(await self._connector_detail(op_id))
        return Done(await self._detail(await self.poll(record)))

    async def operator_cancel(self, operator: authority.Principal, op_id: str) -> Done:
        """POST /v1/admin/deferred-operations/{id}/cancel: bridged where cancelable, then the detail."""
        authority.require_operator(operator)
        record = await self.registry.get(op_id)
        if record is None:
            return Done(await self._cancel_connector_own(op_id))
        if not record.terminal:
            _require_cancelable(record)
            kind = kind_of(record)
            if await self.port.cancel(op_id, kind) is None:
                record = await self._conclude(record, Status.UNKNOWN, None, self.clock())
            else:
                observed = await self.port.observe(op_id, kind)
                retry = self._retry(record, None)
                record = await self._record(record, observed, self.clock(), retry, attempts=None)
        return Done(await self._detail(record))

    async def _connector_rows(self, known: set[str]) -> list[dict[str, Any]]:
        """The connector's own operations (connector routes) as operator rows; the registry's left out."""
        if self.operations is None:
            return []
        found = await self.operations.operations()
        rows = (connector_row(m, self.owner_module_id) for m in found)
        return [row for row in rows if row["operation/id"] not in known]

    async def _connector_own(self, op_id: str) -> dict[str, Any]:
        """A connector-route operation's row, or `unknown-operation`."""
        metadata = None if self.operations is None else await self.operations.operation(op_id)
        if metadata is None:
            raise unknown_operation()
        return connector_row(metadata, self.owner_module_id)

    async def _connector_detail(self, op_id: str) -> dict[str, Any]:
        """The detail document of a connector-route operation: no registry history, no receipt."""
        return {"operation": await self._connector_own(op_id), "history": [], "receipt": None}

    async def _cancel_connector_own(self, op_id: str) -> dict[str, Any]:
        """An operator's cancel of a scan or command admitted on the connector routes."""
        row = await self._connector_own(op_id)
        if row["cancelable"]:
            kind: Kind = "discovery" if "scope" in row["metadata"] else "command"
            await self.port.cancel(op_id, kind)
        return await self._connector_detail(op_id)

    async def _detail(self, record: OperationRecord) -> dict[str, Any]:
        history = await self.registry.history(record.operation_id)
        return {
            "operation": documents.durable_view(record),
            "history": documents.history_view(history),
            "receipt": record_receipt(record, history),
        }

    # ---- the Bus -------------------------------------------------------------------------------------------

    async def durable_view(self, op_id: str) -> Mapping[str, Any] | None:
        """The durable projection of one operation (no candidates, no result), or None."""
        record = await self.registry.get(op_id)
        return None if record is None else documents.durable_view(record)


def _invalid_query(name: str, rule: str) -> SensoriumError:
    """422 `invalid-input` naming the query parameter that failed (never its value)."""
    return SensoriumError(
        f"invalid query parameter {name}",
        code=Code.INVALID_INPUT,
        diagnostics=[{"code": Code.INVALID_INPUT, "message": f"/{name}: {rule}"}],
    )


def _require_cancelable(record: OperationRecord) -> None:
    if not record.cancelable:
        reason = record.cancel_unavailable_reason or "this operation cannot be cancelled"
        raise SensoriumError(reason, code=Code.NOT_CANCELABLE)


def _with_metadata(record: OperationRecord, metadata: Mapping[str, Any]) -> OperationRecord:
    return replace(record, metadata=dict(metadata))


def _accepted_handle(record: OperationRecord) -> Accepted:
    """The recorded first handle, read at its `status_href`."""
    return Accepted(record.handle, record.handle["status_href"])
