"""What the reference host answers and records, as plain functions over records and documents (no I/O).

Rules of this file:
- a handle (`deferred-operation.v1`) carries ids, times, links and the caller's own lineage fields; never the
  input, connector configuration or allowlists;
- the host's policy fields replace the connector's: `expires_at` is the host's, `retry_after_seconds` is
  clamped and jittered, and neither appears where CONTRACT §1 forbids it;
- a status the host builds itself (the connector no longer knows the operation, or the host decided the end)
  is made from DURABLE METADATA only, so it never carries candidates, progress or a result value;
- messages are fixed texts chosen by code, never anything read from a caller or a device.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType
from typing import Any, Final

from connector.core import projections
from connector.core.clock import format_time
from connector.core.endings import DEADLINE_EXCEEDED
from connector.core.ids import OPERATION_KIND
from connector.core.lifecycle import Status, is_terminal
from connector.core.operator_rows import error_code_of, follow_status, operator_columns
from connector.core.projections import ERROR_MESSAGES
from connector.errors import Code
from connector.runtime.operations import Kind
from connector.storage.registry import HistoryEvent, OperationRecord

OWNER_MODULE_ID: Final = "sensorium-os"
HOST_OPERATIONS: Final = "/v1/host/operations"
OUTCOME_REF_PREFIX: Final = "outcome:"
_ERROR_STATUSES: Final = frozenset({"failed", "timed-out", "expired"})
_MESSAGES: Final[Mapping[str, str]] = {
    **ERROR_MESSAGES,
    Code.COMMAND_FAILED: "the command failed or its output could not be read",
    Code.INTERNAL: "the host could not complete the operation",
}
_FORGOTTEN: Final = "the connector no longer knows this operation"
_RESULT_GONE: Final = "the connector no longer holds this result"
_STATUS_CODE = re.compile(r"^[a-z][a-z0-9-]{0,63}$")

@dataclass(frozen=True, slots=True)
class KindRules:
    """How the host rebuilds and ends the operations of one kind (the one place it tells them apart)."""

    # The status version it rebuilds from metadata (2: a scan's, with cleanup and the erased result shape).
    status_version: int
    # Whether its durable metadata names an error by `error_code` (a scan) rather than an `error` object.
    error_code_field: bool
    # Whether stopping it waits for a process to exit (a command): a poller must not wait with it.
    stop_waits: bool
    # Whether its end is mirrored after a restart (a command); otherwise the restart interrupted it.
    survives_restart: bool


KIND_RULES: Mapping[Kind, KindRules] = MappingProxyType(
    {
        "discovery": KindRules(
            status_version=2, error_code_field=True, stop_waits=False, survives_restart=False
        ),
        "command": KindRules(
            status_version=1, error_code_field=False, stop_waits=True, survives_restart=True
        ),
    }
)


def kind_of(record: OperationRecord) -> Kind:
    """Discovery metadata always carries its redacted scope; a command's never does."""
    return "discovery" if "scope" in record.metadata else "command"


def rules_of(record: OperationRecord) -> KindRules:
    """The rules of a record's kind."""
    return KIND_RULES[kind_of(record)]


def transport_of(record: OperationRecord) -> str | None:
    """The transport of a discovery operation (for grant checks), else None."""
    scope = record.metadata.get("scope")
    transport = scope.get("transport") if isinstance(scope, Mapping) else None
    return transport if isinstance(transport, str) else None


def status_href(operation_id: str) -> str:
    """The host status path of an operation."""
    return f"{HOST_OPERATIONS}/{operation_id}"


def cancel_href(operation_id: str) -> str:
    """The host cancel path of an operation."""
    return f"{HOST_OPERATIONS}/{operation_id}/cancel"


def outcome_ref(operation_id: str) -> str:
    """`audit/outcome-ref`: the registry's acceptance event (history seq 1) of this operation."""
    return f"{OUTCOME_REF_PREFIX}{operation_id}:1"


def coded(code: str, message: str | None = None) -> dict[str, str]:
    """An `error` or a diagnostic the host builds: `message`, else the fixed text of the code."""
    return projections.coded(code, message=message, messages=_MESSAGES)


def deferred_handle(
    connector_handle: Mapping[str, Any],
    directive: Mapping[str, Any],
    *,
    created_at: datetime,
    expires_at: datetime,
    retry_after_seconds: int,
    owner_module_id: str = OWNER_MODULE_ID,
) -> dict[str, Any]:
    """Map a `sensorium-connector-deferred.v1` to the host's `deferred-operation.v1`."""
    op_id = connector_handle["connector_operation/id"]
    handle: dict[str, Any] = {
        "schema": "deferred-operation.v1",
        "schema/v": 1,
        "status": "deferred",
        "operation/id": op_id,
        "operation/kind": OPERATION_KIND,
        "retry_after_seconds": retry_after_seconds,
        "created_at": format_time(created_at),
        "expires_at": format_time(expires_at),
        "status_href": status_href(op_id),
    }
    if "cancel_path" in connector_handle:
        handle["cancel_href"] = cancel_href(op_id)
    else:
        handle["cancel/unavailable-reason"] = connector_handle["cancel/unavailable-reason"]
    for key in ("correlation/id", "causal/context"):
        if key in directive:
            handle[key] = directive[key]
    handle["audit/outcome-ref"] = outcome_ref(op_id)
    handle["owner_module_id"] = owner_module_id
    handle["capability_id"] = connector_handle["action_id"]
    handle["diagnostics"] = [dict(d) for d in connector_handle.get("diagnostics", ())]
    return handle


def concluded_metadata(
    metadata: Mapping[str, Any], status: Status, error_code: str | None, rules: KindRules
) -> dict[str, Any]:
    """Durable metadata for an end the host decided (expired, unknown, response-too-large)."""
    concluded = {k: v for k, v in metadata.items() if k not in ("result", "retry_after_seconds", "reason")}
    concluded["status"] = status.value
    concluded.pop("error_code", None)
    concluded.pop("error", None)
    if error_code is not None and status.value in _ERROR_STATUSES:
        if rules.error_code_field:
            concluded["error_code"] = error_code
        else:
            concluded["error"] = coded(error_code)
    return concluded


def with_policy_fields(
    document: Mapping[str, Any], record: OperationRecord, retry_after_seconds: int | None
) -> dict[str, Any]:
    """The connector's status with the host's `expires_at`, clamped retry and attempt count."""
    answer = dict(document)
    answer["expires_at"] = format_time(record.expires_at)
    answer.pop("retry_after_seconds", None)
    if not is_terminal(Status(answer["status"])) and retry_after_seconds is not None:
        answer["retry_after_seconds"] = retry_after_seconds
    if record.attempts >= 1:
        answer["attempt_no"] = record.attempts
    if record.causal_context is not None:
        answer["causal/context"] = dict(record.causal_context)
    return answer


def _error_code(record: OperationRecord) -> str:
    found = error_code_of(record.metadata) or record.last_error
    if isinstance(found, str) and _STATUS_CODE.match(found):
        return found
    return DEADLINE_EXCEEDED if record.status in ("timed-out", "expired") else Code.PROVIDER_FAILURE


def record_document(
    record: OperationRecord, *, diagnostics: Sequence[Mapping[str, str]] = ()
) -> dict[str, Any]:
    """A status the host builds from durable metadata: v2 for discovery, v1 for commands."""
    version = rules_of(record).status_version
    document: dict[str, Any] = {
        "schema": f"deferred-operation-status.v{version}",
        "schema/v": version,
        "operation/id": record.operation_id,
        "operation/kind": record.operation_kind,
        "status": record.status,
        "updated_at": format_time(record.updated_at),
        "expires_at": format_time(record.expires_at),
        "diagnostics": [dict(d) for d in diagnostics],
    }
    if not record.terminal and record.retry_after_seconds is not None:
        document["retry_after_seconds"] = record.retry_after_seconds
    if record.attempts >= 1:
        document["attempt_no"] = record.attempts
    if record.status in _ERROR_STATUSES:
        document["error"] = coded(_error_code(record))
    if record.status == "unknown":
        document["diagnostics"].append(coded(Code.UNKNOWN_OPERATION, _FORGOTTEN))
    if version == 2:
        _discovery_parts(document, record)
    elif record.status == "completed":
        document["diagnostics"].append(coded(Code.RESULT_UNAVAILABLE, _RESULT_GONE))
    if record.causal_context is not None:
        document["causal/context"] = dict(record.causal_context)
    return document


def _discovery_parts(document: dict[str, Any], record: OperationRecord) -> None:
    """Cancellation, cleanup and (for completed) the erased result shape, from durable metadata."""
    metadata = record.metadata
    if isinstance(metadata.get("cancellation"), Mapping):
        document["cancellation"] = dict(metadata["cancellation"])
    cleanup = metadata.get("cleanup")
    unseen = {"state": "uncertain", "claim": "held"}
    document["cleanup"] = dict(cleanup) if isinstance(cleanup, Mapping) else unseen
    if record.status == "completed":
        reason = metadata.get("reason", "window-complete")
        erased = metadata.get("erased_at") or format_time(record.updated_at)
        document["result"] = {
            "schema": "sensorium-device-discovery-result.v1",
            "reason": reason,
            "partial": reason != "window-complete",
            "final_revision": 0,
            "candidates": [],
            "erased_at": erased,
        }
        document["diagnostics"].append(coded(Code.RESULT_ERASED, _RESULT_GONE))


def durable_view(record: OperationRecord) -> dict[str, Any]:
    """The operator and Bus projection of one operation: control fields, durable metadata, columns."""
    view: dict[str, Any] = {
        "operation/id": record.operation_id,
        "operation/kind": record.operation_kind,
        "owner_module_id": record.owner_module_id,
        "capability_id": record.capability_id,
        "owner": record.owner,
        "status": record.status,
        "retry_after_seconds": record.retry_after_seconds,
        "next_poll_at": None if record.next_poll_at is None else format_time(record.next_poll_at),
        "expires_at": format_time(record.expires_at),
        "attempts": record.attempts,
        "cancelable": record.cancelable,
        "cancel/unavailable-reason": record.cancel_unavailable_reason,
        "correlation/id": record.correlation_id,
        "continuation_digest": record.continuation_digest,
        "diagnostics_digest": record.diagnostics_digest,
        "last_error": record.last_error,
        "created_at": format_time(record.created_at),
        "updated_at": format_time(record.updated_at),
        "bus_op": record.bus_op,
        "metadata": dict(record.metadata),
        "route": "bus" if record.bus_op else "host",
        **operator_columns(record.metadata, record.capability_id, record.last_error),
    }
    return follow_status(view)


def history_view(events: Sequence[HistoryEvent]) -> list[dict[str, Any]]:
    """Digest-only history events as JSON."""
    return [{"seq": e.seq, "at": format_time(e.at), "status": e.status, "digest": e.digest} for e in events]
