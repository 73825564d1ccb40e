"""The projections of an operation: a discovery's caller-private v2 status and its durable metadata (CONTRACT
§7),
and the `sensorium-connector-deferred.v1` handle of any accepted async directive.

Rules of this file:
- `caller_status_v2` is the only place a snapshot becomes part of a status; it goes to the authorised
  caller and is never stored;
- `durable_metadata` is what the registry, digests, operator views, receipts, the Bus and logs get: no
  candidates, refs, labels or addresses, no `name_prefix`/`instance_prefix` or exclusion values, no identity
  selectors, no count or number derived from candidate content other than `disclosed_count`;
- CONTRACT §1's semantic rules hold by construction: no `progress` while a cancellation is requested (nor once
  one was made: candidates are no longer delivered), `retry_after_seconds` only before the end, `result`
  only on `completed` and equal to the final snapshot, `error` only on failed/timed-out/expired.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, Literal

from connector.core.candidates import format_ms
from connector.core.lifecycle import TERMINAL_STATUSES
from connector.core.scope import DiscoveryScope, redacted_scope
from connector.core.snapshot import Revision
from connector.errors import Code

HANDLE_SCHEMA: Final = "sensorium-connector-deferred.v1"
STATUS_SCHEMA: Final = "deferred-operation-status.v2"
RESULT_SCHEMA: Final = "sensorium-device-discovery-result.v1"
PROGRESS_TYPE: Final = "sensorium-device-discovery-progress.v1"
TERMINAL: Final = TERMINAL_STATUSES
ERROR_STATUSES: Final = frozenset({"failed", "timed-out", "expired"})
COMPLETE_REASON: Final = "window-complete"

# What a caller reads for each terminal code: fixed text, never an input or device value.
ERROR_MESSAGES: Final[Mapping[str, str]] = {
    Code.PROVIDER_UNAVAILABLE: "no usable adapter for this transport",
    Code.PROVIDER_FAILURE: "the provider failed during the scan",
    Code.PROVIDER_RESTARTED: "the adapter or its backend restarted during the scan",
    Code.CANCELLATION_UNCONFIRMED: "the scan did not confirm its stop after cancellation",
    Code.CLEANUP_UNCONFIRMED: "the scan did not confirm its stop",
    Code.INTERRUPTED_BY_RESTART: "the connector restarted during the scan",
    Code.GRANT_REVOKED: "the caller's grant was revoked",
    Code.RESPONSE_TOO_LARGE: "the status exceeded the response size limit",
    Code.DEADLINE_EXCEEDED: "the operation did not finish before its deadline",
}
UNLISTED_MESSAGE: Final = "the operation did not complete"
DEFAULT_ERROR_CODE: Final[Mapping[str, str]] = {
    "failed": Code.PROVIDER_FAILURE,
    "timed-out": Code.DEADLINE_EXCEEDED,
    "expired": Code.DEADLINE_EXCEEDED,
}


@dataclass(frozen=True, slots=True)
class SessionView:
    """Everything a status needs, assembled by the runtime."""

    operation_id: str
    operation_kind: str
    owner: str
    action_id: str
    scope: DiscoveryScope
    status: str
    created_at_ms: int
    updated_at_ms: int
    expires_at_ms: int | None
    retry_after_seconds: int | None
    reason: str | None
    error_code: str | None
    cancellation_state: str | None
    cancellation_requested_at_ms: int | None
    cancellation_confirmed_at_ms: int | None
    cleanup_state: str
    claim: str
    latest: Revision | None
    final_revision: int
    erased_at_ms: int | None
    disclosed_count: int
    causal_context: Mapping[str, Any] | None = None
    # Time of the last lifecycle change (status, cancellation, cleanup, erasure). Unlike `updated_at_ms` it
    # does not move with revision cuts, whose timing follows the devices seen (CONTRACT §7: not durable).
    state_changed_at_ms: int | None = None
    # Status diagnostic codes (e.g. `stop-by-disconnect`, CONTRACT §6.7): fixed names, never device data.
    diagnostics: tuple[str, ...] = ()
    # A provider's fixed one-line reason for not starting (never device data), shown instead of the
    # code's generic message; durable metadata keeps the code only.
    error_detail: str | None = None


def _delivers_candidates(view: SessionView) -> bool:
    """Candidates reach the caller unless erased or once a cancellation was asked for."""
    return view.latest is not None and view.erased_at_ms is None and view.cancellation_state is None


def _progress(view: SessionView, revision: Revision) -> dict[str, Any]:
    return {
        "type": PROGRESS_TYPE,
        "revision": revision.revision,
        "generation": revision.generation,
        "snapshot": revision.snapshot(),
        "bounds": {
            "max_candidates": view.scope.max_candidates,
            "max_snapshot_bytes": view.scope.max_snapshot_bytes,
        },
    }


def _result(view: SessionView) -> dict[str, Any]:
    """The discovery result: the final snapshot, or its erased shape after retention."""
    reason = view.reason or COMPLETE_REASON
    result: dict[str, Any] = {
        "schema": RESULT_SCHEMA,
        "reason": reason,
        "partial": reason != COMPLETE_REASON,
        "final_revision": view.final_revision,
        "candidates": [],
    }
    if view.erased_at_ms is not None:
        result["erased_at"] = format_ms(view.erased_at_ms)
    elif view.latest is not None:
        result["final_revision"] = view.latest.revision
        result["candidates"] = list(view.latest.candidates)
    else:
        result["final_revision"] = 0
    return result


def coded(
    code: str, *, message: str | None = None, messages: Mapping[str, str] = ERROR_MESSAGES
) -> dict[str, str]:
    """A status's `{code, message}` (its `error` or one diagnostic): `message`, else the code's fixed text in
    `messages` (never an input or device value)."""
    return {"code": code, "message": message or messages.get(code, UNLISTED_MESSAGE)}


def _error(view: SessionView) -> dict[str, str]:
    return coded(view.error_code or DEFAULT_ERROR_CODE[view.status], message=view.error_detail)


def _cancellation(view: SessionView) -> dict[str, Any] | None:
    if view.cancellation_state is None or view.cancellation_requested_at_ms is None:
        return None
    cancellation: dict[str, Any] = {
        "state": view.cancellation_state,
        "requested_at": format_ms(view.cancellation_requested_at_ms),
    }
    if view.cancellation_state == "confirmed" and view.cancellation_confirmed_at_ms is not None:
        cancellation["confirmed_at"] = format_ms(view.cancellation_confirmed_at_ms)
    return cancellation


def caller_status_v2(view: SessionView) -> dict[str, Any]:
    """The caller-private `deferred-operation-status.v2` of a discovery (never stored)."""
    status: dict[str, Any] = {
        "schema": STATUS_SCHEMA,
        "schema/v": 2,
        "operation/id": view.operation_id,
        "operation/kind": view.operation_kind,
        "status": view.status,
        "updated_at": format_ms(view.updated_at_ms),
        "diagnostics": [{"code": code} for code in view.diagnostics],
    }
    if view.expires_at_ms is not None:
        status["expires_at"] = format_ms(view.expires_at_ms)
    if view.retry_after_seconds is not None and view.status not in TERMINAL:
        status["retry_after_seconds"] = view.retry_after_seconds
    if view.latest is not None and _delivers_candidates(view):
        status["progress"] = _progress(view, view.latest)
    if view.status == "completed":
        status["result"] = _result(view)
    if view.status in ERROR_STATUSES:
        status["error"] = _error(view)
    cancellation = _cancellation(view)
    if cancellation is not None:
        status["cancellation"] = cancellation
    status["cleanup"] = {"state": view.cleanup_state, "claim": view.claim}
    if view.causal_context is not None:
        status["causal/context"] = dict(view.causal_context)
    return status


def disclosed_refs(view: SessionView) -> frozenset[str]:
    """Refs of the candidates `caller_status_v2(view)` carries (its progress snapshot and its result)."""
    if view.latest is None:
        return frozenset()
    in_result = view.status == "completed" and view.erased_at_ms is None
    if not (in_result or _delivers_candidates(view)):
        return frozenset()
    return frozenset(candidate["candidate/ref"] for candidate in view.latest.candidates)


def durable_metadata(view: SessionView) -> dict[str, Any]:
    """The durable projection (CONTRACT §7): what may be stored, digested, logged or sent on the Bus."""
    metadata: dict[str, Any] = {
        "operation/id": view.operation_id,
        "operation/kind": view.operation_kind,
        "owner": view.owner,
        "action_id": view.action_id,
        "status": view.status,
        "created_at": format_ms(view.created_at_ms),
        "updated_at": format_ms(
            view.updated_at_ms if view.state_changed_at_ms is None else view.state_changed_at_ms
        ),
        "scope": redacted_scope(view.scope),
        "disclosed_count": view.disclosed_count,
        "cleanup": {"state": view.cleanup_state, "claim": view.claim},
    }
    if view.expires_at_ms is not None:
        metadata["expires_at"] = format_ms(view.expires_at_ms)
    if view.status == "completed":
        metadata["reason"] = view.reason or COMPLETE_REASON
    if view.status in ERROR_STATUSES:
        metadata["error_code"] = _error(view)["code"]
    cancellation = _cancellation(view)
    if cancellation is not None:
        metadata["cancellation"] = cancellation
    if view.erased_at_ms is not None:
        metadata["erased_at"] = format_ms(view.erased_at_ms)
    return metadata


def command_metadata(status: Mapping[str, Any]) -> dict[str, Any]:
    """The durable metadata of a command: its status document without `result`."""
    return {key: value for key, value in status.items() if key != "result"}


def status_from_durable(
    metadata: Mapping[str, Any], *, final_revision: int, causal_context: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The v2 status of a scan the runtime no longer holds, from its durable record (never candidates).

    Equal to what `caller_status_v2` answered once the result was erased (or, after a restart, to the
    interrupted end): the session leaves memory then and this answers until metadata retention ends.
    """
    state = metadata["status"]
    status: dict[str, Any] = {
        "schema": STATUS_SCHEMA,
        "schema/v": 2,
        "operation/id": metadata["operation/id"],
        "operation/kind": metadata["operation/kind"],
        "status": state,
        "updated_at": metadata["updated_at"],
        "diagnostics": [],
    }
    if "expires_at" in metadata:
        status["expires_at"] = metadata["expires_at"]
    if state == "completed":
        reason = metadata.get("reason") or COMPLETE_REASON
        status["result"] = {
            "schema": RESULT_SCHEMA,
            "reason": reason,
            "partial": reason != COMPLETE_REASON,
            "final_revision": final_revision,
            "candidates": [],
        }
        if "erased_at" in metadata:
            status["result"]["erased_at"] = metadata["erased_at"]
    if state in ERROR_STATUSES:
        status["error"] = coded(metadata.get("error_code") or DEFAULT_ERROR_CODE[state])
    if "cancellation" in metadata:
        status["cancellation"] = dict(metadata["cancellation"])
    status["cleanup"] = dict(metadata["cleanup"])
    if causal_context is not None:
        status["causal/context"] = dict(causal_context)
    return status


def deferred_handle(
    operation_id: str,
    action_id: str,
    *,
    retry_after_seconds: int,
    fail_after: timedelta,
    rounding: Literal["down", "up"],
    cancel_unavailable_reason: str | None = None,
) -> dict[str, Any]:
    """The `sensorium-connector-deferred.v1` of an accepted operation; cancelable unless a reason is given.

    `fail_after_seconds` is the whole seconds of `fail_after`: a scan rounds down (the hint never outlives
    the session's own expiry), a command rounds up (its handle has always spelled the full TTL).
    """
    seconds = fail_after.total_seconds()
    whole = math.floor(seconds) if rounding == "down" else math.ceil(seconds)
    handle: dict[str, Any] = {
        "schema": HANDLE_SCHEMA,
        "connector_operation/id": operation_id,
        "action_id": action_id,
        "retry_after_seconds": retry_after_seconds,
        "status_path": f"/v1/operations/{operation_id}",
        "fail_after_seconds": max(0, whole),
    }
    if cancel_unavailable_reason is None:
        handle["cancel_path"] = f"/v1/operations/{operation_id}/cancel"
    else:
        handle["cancel/unavailable-reason"] = cancel_unavailable_reason
    handle["diagnostics"] = []
    return handle
