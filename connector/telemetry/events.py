"""Lifecycle events as plain data, and their one-line text and JSON forms (pure: no I/O).

Rules of this file:
- an event carries durable metadata only (CONTRACT §7): ids, action, transport, adapter, status, reason or
  error code, cleanup and claim states, durations. Never a candidate, label, address, payload or a
  filter value; the types below have no field that could hold one;
- `code` and every other word are checked against a small vocabulary before they leave, so even a bug
  upstream cannot turn an arbitrary string into a log line or a metric label.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

EVENTS: Final = frozenset({"admitted", "running", "cancel-requested", "ended", "cleanup-confirmed"})
KINDS: Final = frozenset({"discovery", "command"})
# Words (statuses, codes, states, transports, adapter names) are short slugs; anything else is dropped.
_WORD = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_OPERATION_ID = re.compile(r"^deferred:[a-z0-9.]+:[A-Z2-7]{26}$")
_ACTION_ID = re.compile(r"^[a-z0-9][a-z0-9._-]{0,127}$")


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One change in an operation's life, as the operator and the metrics see it."""

    event: str
    operation_id: str
    action_id: str
    kind: str
    status: str
    transport: str | None = None
    adapter: str | None = None
    code: str | None = None
    cleanup: str | None = None
    claim: str | None = None
    duration_ms: int | None = None
    cancel_latency_ms: int | None = None
    cleanup_ms: int | None = None

    def fields(self) -> dict[str, Any]:
        """The event as ordered key/value pairs (absent values left out, unsafe words dropped)."""
        pairs: dict[str, Any] = {
            "event": self.event if self.event in EVENTS else "unknown",
            "op": self.operation_id if _OPERATION_ID.match(self.operation_id) else "-",
            "action": self.action_id if _ACTION_ID.match(self.action_id) else "-",
            "kind": self.kind if self.kind in KINDS else "-",
        }
        words = (
            ("transport", self.transport),
            ("adapter", self.adapter),
            ("status", self.status),
            ("code", self.code),
            ("cleanup", self.cleanup),
            ("claim", self.claim),
        )
        for key, word in words:
            if word is not None and _WORD.match(word):
                pairs[key] = word
        durations = (
            ("duration_ms", self.duration_ms),
            ("cancel_latency_ms", self.cancel_latency_ms),
            ("cleanup_ms", self.cleanup_ms),
        )
        for key, value in durations:
            if value is not None:
                pairs[key] = max(0, int(value))
        return pairs


def format_text(fields: Mapping[str, Any]) -> str:
    """`key=value` pairs on one line (values are slugs and integers: nothing needs quoting)."""
    return " ".join(f"{key}={value}" for key, value in fields.items())


def safe_word(value: object) -> str | None:
    """A status, code or state word fit for a log line or a metric label, else None."""
    return value if isinstance(value, str) and _WORD.match(value) else None
