"""Execution receipts (P081): a terminal status with `causal/context` projects to `execution-receipt.v1`.

Pure functions. A receipt names the causal operation (`causal/context.operation/id`), the local deferred
handle, the terminal status and when it ended - nothing from the result, so no candidate data.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from connector.core.clock import format_time
from connector.core.lifecycle import TERMINAL_STATUSES, Status
from connector.storage.registry import HistoryEvent, OperationRecord

_TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)


def execution_receipt(status: Mapping[str, Any], *, finished_at: str | None = None) -> dict[str, Any] | None:
    """The receipt of a terminal status document, or None (not terminal, or no causal context)."""
    context = status.get("causal/context")
    if status.get("status") not in _TERMINAL or not isinstance(context, Mapping):
        return None
    finished = finished_at or status.get("updated_at")
    if not isinstance(finished, str):
        raise ValueError("a receipt needs the time the operation finished")
    return {
        "schema": "execution-receipt.v1",
        "operation/id": context["operation/id"],
        "deferred_operation/id": status["operation/id"],
        "status": status["status"],
        "finished_at": finished,
        "causal/context": dict(context),
    }


def finished_at(record: OperationRecord, history: Sequence[HistoryEvent]) -> datetime:
    """When the operation turned terminal: its first terminal history event (else its last update)."""
    for event in history:
        if Status(event.status) in TERMINAL_STATUSES:
            return event.at
    return record.updated_at


def record_receipt(record: OperationRecord, history: Sequence[HistoryEvent]) -> dict[str, Any] | None:
    """The receipt of a recorded terminal operation, from its control fields only."""
    if not record.terminal or record.causal_context is None:
        return None
    status = {
        "operation/id": record.operation_id,
        "status": record.status,
        "causal/context": record.causal_context,
    }
    return execution_receipt(status, finished_at=format_time(finished_at(record, history)))
