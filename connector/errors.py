"""The typed error hierarchy: every refusal carries a stable `code` that maps to `sensorium-error.v1`.

Rules of this file:
- `Code` names every error code the code base raises, answers or records, and `CODES` states each one once:
  its HTTP status (CONTRACT §14; None when it is never an HTTP answer), what the Bus makes of it (CONTRACT
  §10) and a one-line description. `HTTP_STATUS_BY_CODE`, the exception classes, the OpenAPI builder and the
  Bus map read it; a new code is added here (and to CONTRACT §14) first.
- `Code` is a `StrEnum`: a member is equal to its wire spelling, so documents and rows do not change.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Any


class Code(StrEnum):
    """Every error code, spelled as on the wire."""

    # Refusals (an HTTP answer, CONTRACT §14).
    INVALID_JSON = "invalid-json"
    UNAUTHENTICATED = "unauthenticated"
    FORBIDDEN = "forbidden"
    UNKNOWN_ACTION = "unknown-action"
    UNKNOWN_OPERATION = "unknown-operation"
    UNKNOWN_CANDIDATE = "unknown-candidate"
    UNKNOWN_BINDING = "unknown-binding"
    NOT_FOUND = "not-found"
    METHOD_NOT_ALLOWED = "method-not-allowed"
    REQUEST_TIMEOUT = "request-timeout"
    EXECUTION_MODE_NOT_SUPPORTED = "execution-mode-not-supported"
    STATUS_V2_REQUIRED = "status-v2-required"
    IDEMPOTENCY_CONFLICT = "idempotency-conflict"
    TRANSPORT_CLAIMED = "transport-claimed"
    NOT_CANCELABLE = "not-cancelable"
    SESSION_NOT_TERMINATED = "session-not-terminated"
    NOT_BINDABLE = "not-bindable"
    CANDIDATE_CONSUMED = "candidate-consumed"
    CANDIDATE_EXPIRED = "candidate-expired"
    MISDIRECTED_REQUEST = "misdirected-request"
    BODY_TOO_LARGE = "body-too-large"
    INVALID_DIRECTIVE = "invalid-directive"
    INVALID_INPUT = "invalid-input"
    TOO_MANY_OPERATIONS = "too-many-operations"
    INTERNAL = "internal"
    OVERLOADED = "overloaded"
    # Terminal `error.code` of a status.
    PROVIDER_UNAVAILABLE = "provider-unavailable"
    PROVIDER_FAILURE = "provider-failure"
    PROVIDER_RESTARTED = "provider-restarted"
    CANCELLATION_UNCONFIRMED = "cancellation-unconfirmed"
    CLEANUP_UNCONFIRMED = "cleanup-unconfirmed"
    INTERRUPTED_BY_RESTART = "interrupted-by-restart"
    GRANT_REVOKED = "grant-revoked"
    RESPONSE_TOO_LARGE = "response-too-large"
    DEADLINE_EXCEEDED = "deadline-exceeded"
    COMMAND_FAILED = "command-failed"
    # Diagnostics of a status or of a host continuation.
    STOP_BY_DISCONNECT = "stop-by-disconnect"
    DEFERRED_OPERATION = "deferred-operation"
    DEFERRED_NOT_ACCEPTED = "deferred-not-accepted"
    RESULT_UNAVAILABLE = "result-unavailable"
    RESULT_ERASED = "result-erased"
    # Catalog refusals (`catalog verify` exit 1, `serve` exit 2).
    CATALOG_REFUSED = "catalog-refused"
    CATALOG_MISSING = "catalog-missing"
    CATALOG_UNSIGNED = "catalog-unsigned"
    CATALOG_UNREADABLE = "catalog-unreadable"
    CATALOG_STATE_INVALID = "catalog-state-invalid"
    CATALOG_MALFORMED = "catalog-malformed"
    CATALOG_UNKNOWN_KEY = "catalog-unknown-key"
    CATALOG_BAD_SIGNATURE = "catalog-bad-signature"
    CATALOG_EXPIRED = "catalog-expired"
    CATALOG_NOT_YET_VALID = "catalog-not-yet-valid"
    CATALOG_ROLLBACK = "catalog-rollback"
    CATALOG_INVALID = "catalog-invalid"
    CATALOG_TRUST_INVALID = "catalog-trust-invalid"
    CATALOG_KEY_INVALID = "catalog-key-invalid"
    CATALOG_TEST_KEY = "catalog-test-key"
    # Local errors: raised and caught inside, or shown by a CLI command; never a wire answer of their own.
    ILLEGAL_TRANSITION = "illegal-transition"
    INVALID_POLICY = "invalid-policy"
    PRINCIPAL_EXISTS = "principal-exists"
    UNKNOWN_PRINCIPAL = "unknown-principal"
    UNKNOWN_GRANT = "unknown-grant"
    PRINCIPALS_MALFORMED = "principals-malformed"


class BusAnswer(StrEnum):
    """What the Bus makes of a code (CONTRACT §10)."""

    REFUSED = "refused"  # the request is answered {op, state, error: sensorium-error.v1}
    UNKNOWN = "unknown"  # the request is answered {op, state: unknown}, no error: nothing to show the caller
    FAILED = "failed"  # the operation's state is `failed`, the code travels as reason / error_code
    LOST = "lost"  # the operation's state is `lost`, the code travels as reason
    NONE = "none"  # never on the Bus


@dataclass(frozen=True, slots=True)
class CodeFacts:
    """Everything stated about one code."""

    http_status: int | None
    bus: BusAnswer
    description: str


def _refusal(status: int, description: str) -> CodeFacts:
    return CodeFacts(status, BusAnswer.REFUSED, description)


def _outcome(description: str, bus: BusAnswer = BusAnswer.FAILED) -> CodeFacts:
    return CodeFacts(None, bus, description)


def _local(description: str) -> CodeFacts:
    return CodeFacts(None, BusAnswer.NONE, description)


CODES: Mapping[Code, CodeFacts] = MappingProxyType(
    {
        Code.INVALID_JSON: _refusal(400, "the body is not strict JSON"),
        Code.UNAUTHENTICATED: _refusal(401, "no or unknown token"),
        Code.FORBIDDEN: _refusal(403, "no grant for the action or scope"),
        Code.UNKNOWN_ACTION: _refusal(404, "the catalog has no such action"),
        Code.UNKNOWN_OPERATION: CodeFacts(
            404, BusAnswer.UNKNOWN, "not this principal's operation, never seen, or forgotten"
        ),
        Code.UNKNOWN_CANDIDATE: _refusal(404, "no such candidate in this operation"),
        Code.UNKNOWN_BINDING: _refusal(404, "no such binding"),
        Code.NOT_FOUND: _refusal(404, "a route that does not exist"),
        Code.METHOD_NOT_ALLOWED: _refusal(405, "a method the route does not take"),
        Code.REQUEST_TIMEOUT: _refusal(408, "headers or body too slow (CONTRACT §8)"),
        Code.EXECUTION_MODE_NOT_SUPPORTED: _refusal(409, "the action does not run in the asked timing mode"),
        Code.STATUS_V2_REQUIRED: _refusal(409, "the caller must accept the deferred-status.v2 document"),
        Code.IDEMPOTENCY_CONFLICT: _refusal(409, "the idempotency key names another directive"),
        Code.TRANSPORT_CLAIMED: _refusal(409, "the adapter is claimed by another session or a held cleanup"),
        Code.NOT_CANCELABLE: _refusal(409, "the operation cannot be cancelled"),
        Code.SESSION_NOT_TERMINATED: _refusal(409, "the discovery session has not confirmed its end"),
        Code.NOT_BINDABLE: _refusal(409, "the candidate cannot be bound"),
        Code.CANDIDATE_CONSUMED: _refusal(409, "the candidate was already bound"),
        Code.CANDIDATE_EXPIRED: _refusal(410, "the candidate's binding window has passed"),
        Code.MISDIRECTED_REQUEST: _refusal(421, "a Host this server does not answer for (CONTRACT §8)"),
        Code.BODY_TOO_LARGE: _refusal(413, "the body is over the limit"),
        Code.INVALID_DIRECTIVE: _refusal(422, "the directive breaks its schema or CONTRACT §1"),
        Code.INVALID_INPUT: _refusal(422, "the input or request breaks the action's rules"),
        Code.TOO_MANY_OPERATIONS: _refusal(429, "the per-principal limit is reached, with Retry-After"),
        Code.INTERNAL: _refusal(500, "a bug of ours, with no detail of the input"),
        Code.OVERLOADED: _refusal(503, "the connection cap is reached (CONTRACT §8), with Retry-After"),
        Code.PROVIDER_UNAVAILABLE: _outcome("no adapter, adapter powered off, or backend missing"),
        Code.PROVIDER_FAILURE: _outcome("the provider backend failed"),
        Code.PROVIDER_RESTARTED: _outcome("the backend or adapter restarted during the session"),
        Code.CANCELLATION_UNCONFIRMED: _outcome("a cancel was asked but the stop was not confirmed"),
        Code.CLEANUP_UNCONFIRMED: _outcome("a provider stop raised or did not acknowledge in time"),
        Code.INTERRUPTED_BY_RESTART: _outcome("the connector restarted during the operation", BusAnswer.LOST),
        Code.GRANT_REVOKED: _outcome("the caller's grant was revoked"),
        Code.RESPONSE_TOO_LARGE: _outcome("the result is over the response limit"),
        Code.DEADLINE_EXCEEDED: _outcome("the operation's timeout or expiry passed"),
        Code.COMMAND_FAILED: _outcome("a command action exited non-zero"),
        Code.STOP_BY_DISCONNECT: _local("status diagnostic: the provider stopped when the peer disconnected"),
        Code.DEFERRED_OPERATION: _local("continuation diagnostic: the operation ended other than completed"),
        Code.DEFERRED_NOT_ACCEPTED: _local("host continuation diagnostic: the answer was no deferred handle"),
        Code.RESULT_UNAVAILABLE: _local("host status diagnostic: the connector no longer holds the result"),
        Code.RESULT_ERASED: _local("host status diagnostic: the result was erased"),
        Code.CATALOG_REFUSED: _local("the action catalog or its signature was refused"),
        Code.CATALOG_MISSING: _local("no catalog file"),
        Code.CATALOG_UNSIGNED: _local("no signature file beside the catalog"),
        Code.CATALOG_UNREADABLE: _local("the catalog or signature cannot be read"),
        Code.CATALOG_STATE_INVALID: _local("the accepted-version state file is invalid"),
        Code.CATALOG_MALFORMED: _local("the signature document is malformed"),
        Code.CATALOG_UNKNOWN_KEY: _local("the signature names a key the trust directory lacks"),
        Code.CATALOG_BAD_SIGNATURE: _local("the signature does not verify"),
        Code.CATALOG_EXPIRED: _local("the signature has expired"),
        Code.CATALOG_NOT_YET_VALID: _local("the signature is not valid yet"),
        Code.CATALOG_ROLLBACK: _local("the catalog version is lower than one already accepted"),
        Code.CATALOG_INVALID: _local("the catalog breaks a rule of the contract"),
        Code.CATALOG_TRUST_INVALID: _local("the trust directory is invalid"),
        Code.CATALOG_KEY_INVALID: _local("a key file is invalid"),
        Code.CATALOG_TEST_KEY: _local(
            "the trust directory holds the published test key without --allow-test-key"
        ),
        Code.ILLEGAL_TRANSITION: _local("a move the lifecycle table does not allow"),
        Code.INVALID_POLICY: _local("a host policy breaks its rules"),
        Code.PRINCIPAL_EXISTS: _local("a principal with this id already exists"),
        Code.UNKNOWN_PRINCIPAL: _local("no principal with this id"),
        Code.UNKNOWN_GRANT: _local("the principal holds no grant for this action"),
        Code.PRINCIPALS_MALFORMED: _local("the principals file is malformed"),
    }
)

# CONTRACT §14: HTTP status of every refusal code. Codes that are not refusals have no HTTP status.
HTTP_STATUS_BY_CODE: Mapping[str, int] = MappingProxyType(
    {code: facts.http_status for code, facts in CODES.items() if facts.http_status is not None}
)


class SensoriumError(Exception):
    """Root of every error this project raises on purpose; carries a stable `code`."""

    default_code: str = Code.INTERNAL

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        diagnostics: Sequence[Mapping[str, str]] = (),
        retry_after_seconds: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = str(code or self.default_code)  # a plain str on every wire, whichever way it came
        self.message = message
        self.diagnostics = tuple(dict(d) for d in diagnostics)
        self.retry_after_seconds = retry_after_seconds

    @property
    def http_status(self) -> int:
        """HTTP status for this code (500 for codes that are not refusals)."""
        return HTTP_STATUS_BY_CODE.get(self.code, 500)

    def to_document(self) -> dict[str, Any]:
        """The `sensorium-error.v1` body; messages never hold input values."""
        doc: dict[str, Any] = {"schema": "sensorium-error.v1", "code": self.code, "message": self.message}
        if self.diagnostics:
            doc["diagnostics"] = [dict(d) for d in self.diagnostics]
        if self.retry_after_seconds is not None:
            doc["retry_after_seconds"] = self.retry_after_seconds
        return doc


def unknown_operation() -> SensoriumError:
    """The one answer for an operation that is not this principal's, never seen, or forgotten."""
    return SensoriumError("unknown operation", code=Code.UNKNOWN_OPERATION)


class AdmissionError(SensoriumError):
    """A directive was refused during admission (CONTRACT section 2)."""

    default_code = Code.INVALID_DIRECTIVE


class CatalogError(SensoriumError):
    """The action catalog or its signature was refused."""

    default_code = Code.CATALOG_REFUSED


class LifecycleError(SensoriumError):
    """An illegal lifecycle transition was attempted."""

    default_code = Code.INTERNAL


class ProviderError(SensoriumError):
    """A provider backend failed; translated at the provider edge."""

    default_code = Code.PROVIDER_FAILURE


class ProviderUnavailable(ProviderError):
    """No adapter, adapter powered off, or backend missing."""

    default_code = Code.PROVIDER_UNAVAILABLE


class ProviderRestarted(ProviderError):
    """The backend or adapter restarted during a session."""

    default_code = Code.PROVIDER_RESTARTED


class StopUnconfirmed(ProviderError):
    """A provider stop raised or did not acknowledge in time."""

    default_code = Code.CLEANUP_UNCONFIRMED
