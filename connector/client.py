"""A typed async client of the connector's HTTP API (CONTRACT §9), for callers such as sensorium-core.

Every answer is parsed into its `connector.contract.models` model; every refusal raises the
`ConnectorError` subclass of its CONTRACT §14 code, carrying `retry_after_seconds`. A request whose reply was
lost (connection dropped, read timed out) is sent again unchanged: `start` and `bind` always carry an
`idempotency_key`, so the repeat joins the first attempt's work. Refusals that say when to come back
(`Retry-After`: too many operations, a claimed transport, a session not yet terminated) are retried after
that many seconds, within `max_attempts`.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, ClassVar

import anyio
import httpx
from pydantic import BaseModel, ValidationError

from connector.contract.models import (
    ConnectorDeferred,
    DeferredOperation,
    DeferredOperationStatusV1,
    DeferredOperationStatusV2,
    DeviceBinding,
    Directive,
    DirectiveResult,
    ErrorDocument,
    validate_wire,
)
from connector.core.lifecycle import TERMINAL_STATUSES
from connector.core.policy import MAX_WAIT_SECONDS
from connector.errors import Code

Status = DeferredOperationStatusV1 | DeferredOperationStatusV2
TERMINAL: frozenset[str] = frozenset(status.value for status in TERMINAL_STATUSES)
_RETRIED_CODES = frozenset({Code.TOO_MANY_OPERATIONS, Code.TRANSPORT_CLAIMED, Code.SESSION_NOT_TERMINATED})
_LOST_REPLY = (httpx.TransportError,)  # connect, read, write, pool and protocol errors


# ---- typed errors (CONTRACT §14)
# -----------------------------------------------------------------------------


class ConnectorError(Exception):
    """A `sensorium-error.v1` refusal; `code` is its CONTRACT §14 code."""

    code: ClassVar[str] = ""  # each subclass below names one CONTRACT §14 code

    def __init__(self, status_code: int, document: ErrorDocument, retry_after_seconds: int | None) -> None:
        paths = "; ".join(d.message or d.code for d in document.diagnostics or ())
        super().__init__(f"{document.code}: {document.message}" + (f" ({paths})" if paths else ""))
        self.status_code = status_code
        self.document = document
        self.message = document.message
        self.diagnostics = [d.model_dump(by_alias=True) for d in document.diagnostics or ()]
        self.retry_after_seconds = retry_after_seconds


class ProtocolError(Exception):
    """An answer that is not what the API documents (status, or a body that breaks its schema)."""


class InvalidJsonError(ConnectorError):
    """`invalid-json`."""

    code = Code.INVALID_JSON


class UnauthenticatedError(ConnectorError):
    """`unauthenticated`."""

    code = Code.UNAUTHENTICATED


class ForbiddenError(ConnectorError):
    """`forbidden`."""

    code = Code.FORBIDDEN


class UnknownActionError(ConnectorError):
    """`unknown-action`."""

    code = Code.UNKNOWN_ACTION


class UnknownOperationError(ConnectorError):
    """`unknown-operation`."""

    code = Code.UNKNOWN_OPERATION


class UnknownCandidateError(ConnectorError):
    """`unknown-candidate`."""

    code = Code.UNKNOWN_CANDIDATE


class UnknownBindingError(ConnectorError):
    """`unknown-binding`."""

    code = Code.UNKNOWN_BINDING


class NotFoundError(ConnectorError):
    """`not-found`."""

    code = Code.NOT_FOUND


class MethodNotAllowedError(ConnectorError):
    """`method-not-allowed`."""

    code = Code.METHOD_NOT_ALLOWED


class ExecutionModeNotSupportedError(ConnectorError):
    """`execution-mode-not-supported`."""

    code = Code.EXECUTION_MODE_NOT_SUPPORTED


class StatusV2RequiredError(ConnectorError):
    """`status-v2-required`."""

    code = Code.STATUS_V2_REQUIRED


class IdempotencyConflictError(ConnectorError):
    """`idempotency-conflict`."""

    code = Code.IDEMPOTENCY_CONFLICT


class TransportClaimedError(ConnectorError):
    """`transport-claimed`."""

    code = Code.TRANSPORT_CLAIMED


class NotCancelableError(ConnectorError):
    """`not-cancelable`."""

    code = Code.NOT_CANCELABLE


class SessionNotTerminatedError(ConnectorError):
    """`session-not-terminated`."""

    code = Code.SESSION_NOT_TERMINATED


class NotBindableError(ConnectorError):
    """`not-bindable`."""

    code = Code.NOT_BINDABLE


class CandidateConsumedError(ConnectorError):
    """`candidate-consumed`."""

    code = Code.CANDIDATE_CONSUMED


class DeferredNotAcceptedError(ConnectorError):
    """`deferred-not-accepted`."""

    code = Code.DEFERRED_NOT_ACCEPTED


class CandidateExpiredError(ConnectorError):
    """`candidate-expired`."""

    code = Code.CANDIDATE_EXPIRED


class BodyTooLargeError(ConnectorError):
    """`body-too-large`."""

    code = Code.BODY_TOO_LARGE


class InvalidDirectiveError(ConnectorError):
    """`invalid-directive`."""

    code = Code.INVALID_DIRECTIVE


class InvalidInputError(ConnectorError):
    """`invalid-input`."""

    code = Code.INVALID_INPUT


class TooManyOperationsError(ConnectorError):
    """`too-many-operations`."""

    code = Code.TOO_MANY_OPERATIONS


class InternalError(ConnectorError):
    """`internal`."""

    code = Code.INTERNAL


ERRORS: Mapping[str, type[ConnectorError]] = {
    cls.code: cls for cls in ConnectorError.__subclasses__() if cls.code
}


# ---- documents ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Handle:
    """A deferred operation: where to poll it and, when cancelable, where to cancel it."""

    operation_id: str
    status_path: str
    cancel_path: str | None
    retry_after_seconds: int
    document: ConnectorDeferred | DeferredOperation


@dataclass(frozen=True, slots=True)
class BindingEntry:
    """One item of `GET /v1/bindings`: `address` for the owner, `owner` for an operator."""

    binding_id: str
    transport: str
    bound_at: str
    address: str | None = None
    owner: str | None = None


def _handle(document: BaseModel, location: str | None) -> Handle:
    if isinstance(document, ConnectorDeferred):
        status = location or document.status_path
        return Handle(
            document.connector_operation_id,
            status,
            document.cancel_path,
            document.retry_after_seconds,
            document,
        )
    assert isinstance(document, DeferredOperation)
    status = location or document.status_href or f"/v1/host/operations/{document.operation_id}"
    return Handle(document.operation_id, status, document.cancel_href, document.retry_after_seconds, document)


def _parse(name: str, body: Any) -> BaseModel:
    try:
        return validate_wire(name, body)
    except ValidationError:
        raise ProtocolError(f"the answer is not a valid {name}") from None


def _status(body: Any) -> Status:
    version = body.get("schema") if isinstance(body, dict) else None
    if version not in ("deferred-operation-status.v1", "deferred-operation-status.v2"):
        raise ProtocolError("the answer is not a status document")
    parsed = _parse(version, body)
    assert isinstance(parsed, DeferredOperationStatusV1 | DeferredOperationStatusV2)
    return parsed


def _revision(status: Status) -> int | None:
    if isinstance(status, DeferredOperationStatusV2) and status.progress is not None:
        return status.progress.revision
    return None


def settled_cancellation(status: Status) -> bool:
    """True once a cancel request has an outcome: confirmed, uncertain, or the operation ended anyway."""
    if isinstance(status, DeferredOperationStatusV2) and status.cancellation is not None:
        return status.cancellation.state != "requested"
    return status.status in TERMINAL


# ---- the client -----------------------------------------------------------------------------------------


class ConnectorClient:
    """Talks to one connector (or reference host) as one principal."""

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        directives_path: str = "/v1/directives",
        timeout_s: float = 10.0,
        max_attempts: int = 5,
        max_retry_after_s: int = 60,
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    ) -> None:
        self._http = httpx.AsyncClient(
            base_url=base_url,
            transport=transport,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout_s,
        )
        self._directives_path = directives_path
        self._timeout_s = timeout_s
        self._max_attempts = max(1, max_attempts)
        self._max_retry_after_s = max_retry_after_s
        self._sleep = sleep

    async def __aenter__(self) -> ConnectorClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    # -- directives ---------------------------------------------------------------------------------------

    async def start(self, directive: Directive | Mapping[str, Any]) -> Handle:
        """Admit an async directive; its deferred handle (an `idempotency_key` is added when absent)."""
        response = await self._request("POST", self._directives_path, json=_keyed(directive))
        if response.status_code != 202:
            raise ProtocolError("a sync answer to start(): use run() for sync directives")
        body = response.json()
        name = body.get("schema") if isinstance(body, dict) else None
        if name not in ("sensorium-connector-deferred.v1", "deferred-operation.v1"):
            raise ProtocolError("the answer is not a deferred handle")
        return _handle(_parse(name, body), response.headers.get("location"))

    async def run(self, directive: Directive | Mapping[str, Any]) -> DirectiveResult:
        """Run a sync directive; its result."""
        response = await self._request("POST", self._directives_path, json=_keyed(directive))
        if response.status_code != 200:
            raise ProtocolError("a deferred answer to run(): use start() for async directives")
        parsed = _parse("sensorium-directive-result.v1", response.json())
        assert isinstance(parsed, DirectiveResult)
        return parsed

    # -- operations ---------------------------------------------------------------------------------------

    async def status(
        self, handle: Handle, *, wait_seconds: int | None = None, after_revision: int | None = None
    ) -> Status:
        """The current status, or (long poll) the first one past `after_revision` within `wait_seconds`."""
        params: dict[str, int] = {}
        if wait_seconds:
            params["wait_seconds"] = min(wait_seconds, MAX_WAIT_SECONDS)
            if after_revision is not None:
                params["after_revision"] = after_revision
        timeout = self._timeout_s + params.get("wait_seconds", 0)
        response = await self._request("GET", handle.status_path, params=params, timeout=timeout)
        return _status(response.json())

    async def watch(self, handle: Handle, *, wait_seconds: int = MAX_WAIT_SECONDS) -> AsyncIterator[Status]:
        """Every new status (a higher revision, or any other change) by long poll; ends on a terminal one."""
        current = await self.status(handle)
        yield current
        while current.status not in TERMINAL:
            following = await self.status(
                handle, wait_seconds=wait_seconds, after_revision=_revision(current)
            )
            if following != current:
                current = following
                yield current

    async def cancel(self, handle: Handle, *, wait_seconds: int = MAX_WAIT_SECONDS) -> Status:
        """Request cancellation; returns once it is confirmed or known uncertain (never on `requested`)."""
        if handle.cancel_path is None:
            raise ProtocolError("this operation offers no cancellation")
        current = _status((await self._request("POST", handle.cancel_path)).json())
        while not settled_cancellation(current):
            current = await self.status(handle, wait_seconds=wait_seconds, after_revision=_revision(current))
            if not settled_cancellation(current):
                await self._sleep(min(max(current.retry_after_seconds or 1, 1), self._max_retry_after_s))
        return current

    # -- candidates and bindings --------------------------------------------------------------------------

    async def select(self, handle: Handle, candidate_ref: str) -> None:
        """Select a candidate of a running snapshot."""
        path = handle.status_path.rstrip("/") + "/selection"
        await self._request("POST", path, json={"candidate/ref": candidate_ref})

    async def bind(
        self, handle: Handle, candidate_ref: str, *, idempotency_key: str | None = None
    ) -> DeviceBinding:
        """Bind a candidate of a terminated session; the binding reveals its address."""
        body = {"candidate/ref": candidate_ref, "idempotency_key": idempotency_key or _new_key()}
        path = handle.status_path.rstrip("/") + "/bindings"
        response = await self._request("POST", path, json=body)
        parsed = _parse("sensorium-device-binding.v1", response.json())
        assert isinstance(parsed, DeviceBinding)
        return parsed

    async def forget(self, binding_id: str) -> None:
        """Forget (erase) a binding; `unknown-binding` after a lost reply means the lost DELETE did it."""
        await self._request("DELETE", f"/v1/bindings/{binding_id}", done_after_loss=(Code.UNKNOWN_BINDING,))

    async def bindings(self) -> list[BindingEntry]:
        """The bindings this principal may see."""
        body = (await self._request("GET", "/v1/bindings")).json()
        try:
            return [
                BindingEntry(b["binding/id"], b["transport"], b["bound_at"], b.get("address"), b.get("owner"))
                for b in body["bindings"]
            ]
        except (KeyError, TypeError):
            raise ProtocolError("the answer is not a binding list") from None

    # -- transport ----------------------------------------------------------------------------------------

    async def _request(
        self, method: str, path: str, *, done_after_loss: tuple[str, ...] = (), **kwargs: Any
    ) -> httpx.Response:
        """Send; again unchanged after a lost reply or a refusal with `Retry-After`; raise typed errors.

        `done_after_loss`: refusal codes that, once a reply was lost, mean the lost attempt already did
        the work (the answer is then the refusal's response, not an error).
        """
        lost = False
        for attempt in range(1, self._max_attempts + 1):
            last = attempt == self._max_attempts
            try:
                response = await self._http.request(method, path, **kwargs)
            except _LOST_REPLY:
                if last:
                    raise
                lost = True
                await self._sleep(min(2 ** (attempt - 1), self._max_retry_after_s))
                continue
            if response.status_code < 400:
                return response
            error = _refusal(response)
            if lost and error.code in done_after_loss:
                return response
            if error.code not in _RETRIED_CODES or error.retry_after_seconds is None or last:
                raise error
            await self._sleep(min(error.retry_after_seconds, self._max_retry_after_s))
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt


def _refusal(response: httpx.Response) -> ConnectorError:
    try:
        parsed = validate_wire("sensorium-error.v1", response.json())
    except (ValueError, ValidationError):
        raise ProtocolError(f"HTTP {response.status_code} without a sensorium-error.v1 body") from None
    assert isinstance(parsed, ErrorDocument)
    header = response.headers.get("retry-after", "")
    retry_after = int(header) if header.isdigit() else parsed.retry_after_seconds
    return ERRORS.get(parsed.code, ConnectorError)(response.status_code, parsed, retry_after)


def _new_key() -> str:
    return "client-" + secrets.token_urlsafe(18)


def _keyed(directive: Directive | Mapping[str, Any]) -> dict[str, Any]:
    """The directive as JSON with an `idempotency_key`, so that a repeat after a lost reply joins it."""
    document = directive.to_wire() if isinstance(directive, Directive) else dict(directive)
    document.setdefault("idempotency_key", _new_key())
    return document
