"""The view's one durable thing: an append-only audit of the actions it forwarded (CONTRACT §15)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.jsonl"


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """When, which lab operator, which node and operation, and what the node answered (a status or code)."""

    at: datetime
    operator: str
    node: str
    operation_id: str
    answer: str

    def line(self) -> bytes:
        """One JSON line."""
        document = {
            "at": self.at.isoformat().replace("+00:00", "Z"),
            "operator": self.operator,
            "node": self.node,
            "operation/id": self.operation_id,
            "action": "cancel",
            "answer": self.answer,
        }
        return (json.dumps(document, separators=(",", ":")) + "\n").encode("utf-8")


def answer_text(answer: Mapping[str, Any]) -> str:
    """A node's `admin.cancel` answer reduced to its status (and cancellation state), or its error code."""
    error = answer.get("error")
    if isinstance(error, Mapping):
        return f"refused {error.get('code')}"
    operation = answer.get("operation")
    operation = operation if isinstance(operation, Mapping) else {}
    status = operation.get("status")
    metadata = operation.get("metadata")
    cancellation = metadata.get("cancellation") if isinstance(metadata, Mapping) else None
    state = cancellation.get("state") if isinstance(cancellation, Mapping) else None
    text = f"status {status}" if isinstance(status, str) else "no status"
    return f"{text}, cancellation {state}" if isinstance(state, str) else text


class AuditLog:
    """`<D>/audit.jsonl`, 0600, opened for appending only."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / AUDIT_FILE

    def append(self, entry: AuditEntry) -> None:
        """Write one line (one `write` on an O_APPEND descriptor)."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, entry.line())
        finally:
            os.close(fd)
