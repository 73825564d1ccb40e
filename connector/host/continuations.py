"""Persisted continuations (CONTRACT §11, P055 6.2-6.3): a flow suspends on a deferred outcome and resumes
once.

Rules of this file:
- a continuation is a value (`orbiplex-continuation.v1`), stored raw in the registry's own table and never
  shown; the operation row carries only its digest;
- on `completed` the flow is resumed exactly once with the status's `result` bound into the continuation's
  `context` under `resume_point.output_binding` (`context[output_binding] = result`); the result is fetched
  live from the connector and handed to the hook only, never stored;
- any other terminal status resumes the flow with a `deferred-operation` diagnostic instead of a value;
- "exactly once" is the registry's atomic claim: racing pollers, a second listener, or a restart between the
  terminal status and the resume cannot hand a continuation out twice. The claim happens just before the
  hook runs, so a crash inside the hook does not re-deliver (at most once per hook run);
- `deferred_response_mode` is the flow's one deferred decision: `surface-to-caller` (default) makes a
  deferred handle or pending status the step's control outcome; `reject-as-failure` refuses it with
  `deferred-not-accepted` (and cancels the accepted work where a cancel surface exists).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol

from connector.contract.validate import validate
from connector.core.authority import Principal
from connector.core.lifecycle import Status, is_terminal
from connector.errors import Code, SensoriumError
from connector.host.metrics import HostMetrics
from connector.service.answers import Accepted, Done, public_refusal
from connector.storage.registry import DeferredRegistry, OperationRecord

_log = logging.getLogger(__name__)

CONTINUATION_SCHEMA = "orbiplex-continuation.v1"


class DeferredResponseMode(StrEnum):
    """A flow's single decision about deferred outcomes."""

    SURFACE_TO_CALLER = "surface-to-caller"
    REJECT_AS_FAILURE = "reject-as-failure"


@dataclass(frozen=True, slots=True)
class Resumption:
    """What a flow's resume hook receives, once per continuation."""

    operation_id: str
    status: str
    continuation: Mapping[str, Any]
    diagnostic: Mapping[str, Any] | None = None

    @property
    def resumed(self) -> bool:
        """True when the flow continues with a value (completed), False when it fails."""
        return self.diagnostic is None


ResumeHook = Callable[[Resumption], Awaitable[None] | None]
ResultFetcher = Callable[[OperationRecord], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class StepOutcome:
    """The control outcome of one flow step that called a deferred-capable capability."""

    kind: Literal["completed", "deferred", "failed"]
    value: Any = None
    diagnostic: Mapping[str, Any] | None = None


def check_continuation(continuation: Any, operation_id: str) -> None:
    """Refuse a continuation that breaks its schema or names another operation (paths only)."""
    problems = [str(v) for v in validate(CONTINUATION_SCHEMA, continuation, via="schema")]
    if not problems and continuation.get("deferred_operation_id") != operation_id:
        problems = ["/deferred_operation_id: operation-mismatch"]
    if problems:
        diagnostics = [{"code": Code.INVALID_INPUT, "message": p} for p in problems[:16]]
        raise SensoriumError("the continuation was refused", code=Code.INVALID_INPUT, diagnostics=diagnostics)


def bind_result(continuation: Mapping[str, Any], result: Any) -> dict[str, Any]:
    """The continuation with `context[resume_point.output_binding] = result`."""
    binding = continuation["resume_point"]["output_binding"]
    context = dict(continuation.get("context") or {})
    context[binding] = result
    return {**continuation, "context": context}


def deferred_diagnostic(record: OperationRecord, code: str = Code.DEFERRED_OPERATION) -> dict[str, Any]:
    """The diagnostic a flow fails with when its deferred operation did not complete."""
    diagnostic: dict[str, Any] = {
        "code": code,
        "message": f"the deferred operation ended {record.status}",
        "operation/id": record.operation_id,
        "status": record.status,
    }
    if record.last_error is not None:
        diagnostic["error_code"] = record.last_error
    return diagnostic


def _status_outcome(body: Mapping[str, Any], mode: DeferredResponseMode) -> StepOutcome:
    status = str(body.get("status"))
    if status not in set(Status):
        return StepOutcome("failed", diagnostic={"code": Code.INTERNAL, "message": "an unreadable answer"})
    if status == Status.COMPLETED:
        return StepOutcome("completed", body.get("result"))
    if is_terminal(Status(status)):
        code = (body.get("error") or {}).get("code")
        diagnostic: dict[str, Any] = {
            "code": Code.DEFERRED_OPERATION,
            "message": f"the deferred operation ended {status}",
            "operation/id": body.get("operation/id"),
            "status": status,
        }
        if code is not None:
            diagnostic["error_code"] = code
        return StepOutcome("failed", diagnostic=diagnostic)
    return _deferred(body, mode)


def _deferred(body: Mapping[str, Any], mode: DeferredResponseMode) -> StepOutcome:
    if mode is DeferredResponseMode.REJECT_AS_FAILURE:
        refused = "this flow does not accept deferred outcomes"
        diagnostic = {"code": Code.DEFERRED_NOT_ACCEPTED, "message": refused}
        return StepOutcome("failed", diagnostic=diagnostic | {"operation/id": body.get("operation/id")})
    return StepOutcome("deferred", body)


def classify_outcome(body: Mapping[str, Any] | None, mode: DeferredResponseMode) -> StepOutcome:
    """What a step's answer means for the flow under its `deferred_response_mode` (pure)."""
    schema = (body or {}).get("schema")
    if body is None or schema == "sensorium-error.v1":
        code = (body or {}).get("code", Code.INTERNAL)
        return StepOutcome("failed", diagnostic={"code": code, "message": "the capability refused the call"})
    if schema == "sensorium-directive-result.v1":
        if body.get("status") == "completed":
            return StepOutcome("completed", body.get("result"))
        code = (body.get("error") or {}).get("code", "failed")
        return StepOutcome("failed", diagnostic={"code": code, "message": "the directive failed"})
    if schema == "deferred-operation.v1":
        return _deferred(body, mode)
    return _status_outcome(body, mode)


class ContinuationStore:
    """Suspends flows on deferred operations and resumes each exactly once when it ends."""

    def __init__(
        self, registry: DeferredRegistry, fetch_result: ResultFetcher, metrics: HostMetrics | None = None
    ) -> None:
        self._registry = registry
        self._fetch_result = fetch_result
        self._metrics = metrics
        self._hook: ResumeHook | None = None

    async def install(self, hook: ResumeHook) -> Callable[[], None]:
        """Install the resume hook and settle every flow that ended without one; returns an undo function."""
        self._hook = hook

        def undo() -> None:
            if self._hook is hook:
                self._hook = None

        await self.settle_pending()
        return undo

    async def suspend(self, operation_id: str, continuation: Mapping[str, Any]) -> str:
        """Store the continuation of a suspended step; returns its digest (the only part ever shown)."""
        check_continuation(continuation, operation_id)
        digest = await self._registry.put_continuation(operation_id, continuation)
        record = await self._registry.get(operation_id)
        if record is not None and record.terminal:
            await self.settle(record)  # it ended before the flow got to suspend
        return digest

    async def settle(self, record: OperationRecord) -> bool:
        """Resume or fail the flow of a terminal operation; True when this call handed it out."""
        hook = self._hook
        if hook is None or not record.terminal or record.continuation_digest is None:
            return False
        continuation = await self._registry.claim_resume(record.operation_id)
        if continuation is None:
            return False
        resumption = await self._resumption(record, continuation)
        self._count("resumed" if resumption.resumed else "failed")
        try:
            outcome = hook(resumption)
            if outcome is not None:
                await outcome
        except Exception as error:  # the flow's own failure; the claim stands
            _log.error("resume hook failed with %s", type(error).__name__)
        return True

    async def settle_pending(self) -> int:
        """Settle every terminal operation whose continuation was never claimed (after a restart)."""
        settled = 0
        for operation_id in await self._registry.unclaimed_continuations():
            record = await self._registry.get(operation_id)
            if record is not None and await self.settle(record):
                settled += 1
        return settled

    async def _resumption(self, record: OperationRecord, continuation: Mapping[str, Any]) -> Resumption:
        if record.status != Status.COMPLETED:
            return Resumption(record.operation_id, record.status, continuation, deferred_diagnostic(record))
        result = await self._fetch_result(record)
        if result is None:
            diagnostic = deferred_diagnostic(record, Code.RESULT_UNAVAILABLE)
            return Resumption(record.operation_id, record.status, continuation, diagnostic)
        return Resumption(record.operation_id, record.status, bind_result(continuation, result))

    def _count(self, outcome: str) -> None:
        if self._metrics is not None:
            self._metrics.continuations.labels(outcome).inc()


class DeferredCapability(Protocol):
    """The host face a flow step calls (the `HostService`)."""

    continuations: ContinuationStore

    def authenticate(self, token: str | None) -> Principal:
        """The principal behind a bearer token."""

    async def admit(
        self, principal: Principal, directive: Any, *, bus_op: str | None = None
    ) -> Accepted | Done:
        """Host admission."""

    async def cancel(self, principal: Principal, op_id: str) -> Done:
        """Cancel an operation of this caller."""


async def run_step(
    host: DeferredCapability,
    token: str | None,
    directive: Mapping[str, Any],
    continuation: Mapping[str, Any],
    mode: DeferredResponseMode = DeferredResponseMode.SURFACE_TO_CALLER,
) -> StepOutcome:
    """Call the capability; on a deferred handle suspend (surface) or refuse and cancel (reject)."""
    try:
        principal = host.authenticate(token)  # once for the step: its admit and its cancel
        answer = await host.admit(principal, directive)
    except SensoriumError as error:
        return classify_outcome(public_refusal(error).to_document(), mode)
    body = answer.handle if isinstance(answer, Accepted) else answer.document
    outcome = classify_outcome(body, mode)
    is_handle = body.get("schema") == "deferred-operation.v1"
    if outcome.kind == "deferred" and is_handle:
        op_id = body["operation/id"]
        stored = {"deadline_at": body["expires_at"], **continuation, "deferred_operation_id": op_id}
        await host.continuations.suspend(op_id, stored)
    elif is_handle and "cancel_href" in body:
        with contextlib.suppress(SensoriumError):  # refused or already gone: the flow fails either way
            await host.cancel(principal, body["operation/id"])
    return outcome
