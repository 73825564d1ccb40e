"""The typed error hierarchy: every refusal carries a stable `code` that maps to `sensorium-error.v1`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# CONTRACT section 14: HTTP status of every refusal code. Terminal status codes have no HTTP status.
HTTP_STATUS_BY_CODE: Mapping[str, int] = {
    "invalid-json": 400,
    "unauthenticated": 401,
    "forbidden": 403,
    "unknown-action": 404,
    "unknown-operation": 404,
    "unknown-candidate": 404,
    "unknown-binding": 404,
    "not-found": 404,
    "method-not-allowed": 405,
    "request-timeout": 408,
    "execution-mode-not-supported": 409,
    "status-v2-required": 409,
    "idempotency-conflict": 409,
    "transport-claimed": 409,
    "not-cancelable": 409,
    "session-not-terminated": 409,
    "not-bindable": 409,
    "candidate-consumed": 409,
    "candidate-expired": 410,
    "misdirected-request": 421,
    "body-too-large": 413,
    "invalid-directive": 422,
    "invalid-input": 422,
    "too-many-operations": 429,
    "internal": 500,
    "overloaded": 503,
}


class SensoriumError(Exception):
    """Root of every error this project raises on purpose; carries a stable `code`."""

    default_code = "internal"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        diagnostics: Sequence[Mapping[str, str]] = (),
        retry_after_seconds: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code or self.default_code
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
    return SensoriumError("unknown operation", code="unknown-operation")


class AdmissionError(SensoriumError):
    """A directive was refused during admission (CONTRACT section 2)."""

    default_code = "invalid-directive"


class CatalogError(SensoriumError):
    """The action catalog or its signature was refused."""

    default_code = "catalog-refused"


class LifecycleError(SensoriumError):
    """An illegal lifecycle transition was attempted."""

    default_code = "internal"


class ProviderError(SensoriumError):
    """A provider backend failed; translated at the provider edge."""

    default_code = "provider-failure"


class ProviderUnavailable(ProviderError):
    """No adapter, adapter powered off, or backend missing."""

    default_code = "provider-unavailable"


class ProviderRestarted(ProviderError):
    """The backend or adapter restarted during a session."""

    default_code = "provider-restarted"


class StopUnconfirmed(ProviderError):
    """A provider stop raised or did not acknowledge in time."""

    default_code = "cleanup-unconfirmed"
