"""What the service answers, independent of HTTP or the Bus: typed documents; refusals are raised.

Every service method returns one of these or raises `SensoriumError`; the edges (`connector.api`,
`connector.bus`) map both to their wire.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from connector.errors import HTTP_STATUS_BY_CODE, Code, SensoriumError

_log = logging.getLogger("sensorium.service")


@dataclass(frozen=True, slots=True)
class Accepted:
    """Deferred work was admitted: its handle, where its status is read, and when to ask again."""

    handle: Mapping[str, Any]
    status_path: str

    @property
    def retry_after_seconds(self) -> int:
        """The handle's own retry hint."""
        retry: int = self.handle["retry_after_seconds"]
        return retry


@dataclass(frozen=True, slots=True)
class Done:
    """A document answered at once: a sync result, a status, a listing."""

    document: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Created:
    """A new resource (a binding) and its document."""

    document: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Gone:
    """A resource was erased; there is nothing more to say."""


Answer = Accepted | Done | Created | Gone


def public_refusal(error: SensoriumError) -> SensoriumError:
    """The error as the caller sees it: a code outside CONTRACT §14 is a bug of ours, answered `internal`."""
    if error.code in HTTP_STATUS_BY_CODE:
        return error
    _log.error("refusal with a code outside the error-code table answered as internal: %s", error.code)
    return SensoriumError("internal error", code=Code.INTERNAL)
