"""Record builders for registry and host unit tests."""

from __future__ import annotations

import base64
import itertools
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from connector.core.ids import OPERATION_KIND
from connector.storage.registry import OperationRecord

T0 = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
_counter = itertools.count(1)


def new_op_id() -> str:
    """A fresh well-formed operation id."""
    raw = next(_counter).to_bytes(16, "big")
    return f"deferred:{OPERATION_KIND}:{base64.b32encode(raw).decode().rstrip('=')}"


def discovery_metadata(op_id: str, status: str = "running", **extra: Any) -> dict[str, Any]:
    """Durable discovery metadata as `durable_metadata` shapes it."""
    metadata: dict[str, Any] = {
        "operation/id": op_id,
        "operation/kind": OPERATION_KIND,
        "owner": "alice",
        "action_id": "device.discovery.scan",
        "status": status,
        "created_at": "2027-01-01T12:00:00.000Z",
        "updated_at": "2027-01-01T12:00:00.000Z",
        "scope": {
            "transport": "ble",
            "window_seconds": 10,
            "limits": {"max_candidates": 64, "max_snapshot_bytes": 65536},
            "filters": {"service_uuids": ["0000180d-0000-1000-8000-00805f9b34fb"]},
        },
        "disclosed_count": 0,
        "cleanup": {"state": "pending", "claim": "held"},
    }
    metadata.update(extra)
    return metadata


def command_metadata(op_id: str, status: str = "running", **extra: Any) -> dict[str, Any]:
    """Durable command metadata: a v1 status without `result`."""
    metadata: dict[str, Any] = {
        "schema": "deferred-operation-status.v1",
        "schema/v": 1,
        "operation/id": op_id,
        "operation/kind": OPERATION_KIND,
        "status": status,
        "expires_at": "2027-01-01T12:15:00.000Z",
        "updated_at": "2027-01-01T12:00:00.000Z",
        "diagnostics": [],
    }
    if status in ("pending", "running"):
        metadata["retry_after_seconds"] = 1
    metadata.update(extra)
    return metadata


def record(
    op_id: str | None = None,
    *,
    status: str = "pending",
    kind: str = "discovery",
    now: datetime = T0,
    ttl: timedelta = timedelta(minutes=15),
    **changes: Any,
) -> OperationRecord:
    """An accepted-operation record (discovery metadata unless `kind="command"`)."""
    op_id = op_id or new_op_id()
    capability = "device.discovery.scan" if kind == "discovery" else "whisper.redaction.prepare"
    metadata = discovery_metadata(op_id, status) if kind == "discovery" else command_metadata(op_id, status)
    base = OperationRecord(
        operation_id=op_id,
        operation_kind=OPERATION_KIND,
        owner_module_id="sensorium-os",
        capability_id=capability,
        owner="alice",
        status=status,
        retry_after_seconds=1,
        next_poll_at=now + timedelta(seconds=1),
        expires_at=now + ttl,
        attempts=0,
        cancelable=True,
        cancel_unavailable_reason=None,
        correlation_id=None,
        continuation_digest=None,
        diagnostics_digest=None,
        last_error=None,
        created_at=now,
        updated_at=now,
        bus_op=None,
        metadata=metadata,
        causal_context=None,
        handle={
            "schema": "deferred-operation.v1",
            "status_href": f"/v1/host/operations/{op_id}",
            "retry_after_seconds": 1,
        },
    )
    return replace(base, **changes)
