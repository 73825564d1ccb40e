"""What the service answers: a status code, a JSON body and headers, independent of HTTP or the Bus."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from connector.errors import HTTP_STATUS_BY_CODE, SensoriumError

_log = logging.getLogger("sensorium.service")


@dataclass(frozen=True, slots=True)
class Reply:
    """One answer of the connector service."""

    status_code: int
    body: Mapping[str, Any] | None
    headers: Mapping[str, str] = field(default_factory=dict)


def error_reply(error: SensoriumError) -> Reply:
    """A `sensorium-error.v1` reply; `Retry-After` travels as a header too.

    A code outside SPEC 14 is a bug of ours, never the caller's: it answers 500 `internal` without detail.
    """
    if error.code not in HTTP_STATUS_BY_CODE:
        _log.error("refusal with a code outside the error-code table answered as internal: %s", error.code)
        error = SensoriumError("internal error", code="internal")
    headers = {}
    if error.retry_after_seconds is not None:
        headers["Retry-After"] = str(error.retry_after_seconds)
    return Reply(error.http_status, error.to_document(), headers)


def unknown_operation() -> SensoriumError:
    """The one answer for an operation that is not this principal's, never seen, or forgotten."""
    return SensoriumError("unknown operation", code="unknown-operation")
