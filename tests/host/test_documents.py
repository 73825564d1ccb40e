"""Pure host documents: handles, host-built statuses for every status, policy fields, receipts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from connector.core.lifecycle import Status
from connector.host import documents
from connector.host.receipts import execution_receipt, finished_at, record_receipt
from connector.runtime.operations import Kind
from connector.storage.registry import HistoryEvent
from tests.host.records import T0, command_metadata, discovery_metadata, record
from tests.host.support import check

CONFIRMED = {"state": "confirmed", "claim": "released"}
CANCELLATION = {
    "state": "confirmed",
    "requested_at": "2027-01-01T12:00:01Z",
    "confirmed_at": "2027-01-01T12:00:02Z",
}
DISCOVERY_EXTRA: dict[str, dict[str, Any]] = {
    "completed": {"reason": "limit-reached", "cleanup": CONFIRMED},
    "failed": {"error_code": "provider-unavailable", "cleanup": CONFIRMED},
    "timed-out": {"error_code": "deadline-exceeded", "cleanup": CONFIRMED},
    "expired": {"error_code": "deadline-exceeded"},
    "cancelled": {"cancellation": CANCELLATION, "cleanup": CONFIRMED},
}
COMMAND_EXTRA: dict[str, dict[str, Any]] = {
    status: {"error": {"code": "command-failed", "message": "m"}}
    for status in ("failed", "timed-out", "expired")
}


def _connector_handle(**extra: Any) -> dict[str, Any]:
    handle = {
        "schema": "sensorium-connector-deferred.v1",
        "connector_operation/id": "deferred:sensorium.directive.invoke:" + "A" * 26,
        "action_id": "device.discovery.scan",
        "retry_after_seconds": 1,
        "status_path": "/v1/operations/x",
        "cancel_path": "/v1/operations/x/cancel",
        "diagnostics": [{"code": "note"}],
    }
    handle.update(extra)
    return handle


def test_the_handle_maps_the_connector_ack_and_echoes_only_lineage() -> None:
    directive = {
        "input": {"secret": "CANARY"},
        "correlation/id": "c-1",
        "causal/context": {"operation/id": "o"},
    }
    handle = documents.deferred_handle(
        _connector_handle(),
        directive,
        created_at=T0,
        expires_at=T0 + timedelta(seconds=90),
        retry_after_seconds=7,
    )
    check("deferred-operation.v1", handle)
    assert handle["retry_after_seconds"] == 7 and handle["expires_at"] == "2027-01-01T12:01:30.000Z"
    assert handle["diagnostics"] == [{"code": "note"}]
    assert "CANARY" not in str(handle) and "status_path" not in handle and "cancel_path" not in handle


def test_a_non_cancelable_ack_maps_to_the_unavailable_reason() -> None:
    ack = _connector_handle(**{"cancel/unavailable-reason": "too late"})
    del ack["cancel_path"]
    handle = documents.deferred_handle(ack, {}, created_at=T0, expires_at=T0, retry_after_seconds=1)
    check("deferred-operation.v1", handle)
    assert handle["cancel/unavailable-reason"] == "too late" and "cancel_href" not in handle


@pytest.mark.parametrize("status", [s.value for s in Status])
@pytest.mark.parametrize("kind", ["discovery", "command"])
def test_host_built_statuses_are_valid_for_every_status(status: str, kind: str) -> None:
    extra = (DISCOVERY_EXTRA if kind == "discovery" else COMMAND_EXTRA).get(status, {})
    base = record(kind=kind, status=status, attempts=2, causal_context={"operation/id": "causal:1"})
    meta = discovery_metadata if kind == "discovery" else command_metadata
    row = record(
        base.operation_id,
        kind=kind,
        status=status,
        attempts=2,
        causal_context={"operation/id": "causal:1"},
        metadata=meta(base.operation_id, status, **extra),
    )
    document = documents.record_document(row)
    check("deferred-operation-status.v2" if kind == "discovery" else "deferred-operation-status.v1", document)
    assert document["attempt_no"] == 2 and document["causal/context"] == {"operation/id": "causal:1"}
    assert ("retry_after_seconds" in document) == (status in ("pending", "running"))
    assert "progress" not in document
    if kind == "discovery" and status == "completed":
        assert document["result"]["candidates"] == [] and "erased_at" in document["result"]
        assert document["result"]["reason"] == "limit-reached" and document["result"]["partial"] is True
    if status in ("failed", "timed-out", "expired"):
        assert document["error"]["code"] in ("provider-unavailable", "deadline-exceeded", "command-failed")


def test_policy_fields_replace_the_connectors() -> None:
    row = record(expires_at=T0 + timedelta(seconds=42), attempts=0, causal_context={"operation/id": "c"})
    running = {"schema": "deferred-operation-status.v1", "status": "running", "retry_after_seconds": 999,
               "expires_at": "2099-01-01T00:00:00Z"}  # fmt: skip
    shaped = documents.with_policy_fields(running, row, 5)
    assert shaped["retry_after_seconds"] == 5 and shaped["expires_at"] == "2027-01-01T12:00:42.000Z"
    assert "attempt_no" not in shaped and shaped["causal/context"] == {"operation/id": "c"}
    done = documents.with_policy_fields({**running, "status": "failed"}, row, 5)
    assert "retry_after_seconds" not in done


@pytest.mark.parametrize(
    ("kind", "status", "code", "expected"),
    [
        ("discovery", Status.EXPIRED, "deadline-exceeded", {"error_code": "deadline-exceeded"}),
        ("discovery", Status.UNKNOWN, None, {}),
        ("command", Status.FAILED, "response-too-large", {"error": {"code": "response-too-large"}}),
    ],
)
def test_concluded_metadata_names_the_host_decided_end(
    kind: Kind, status: Status, code: str | None, expected: dict[str, Any]
) -> None:
    op = record(kind=kind).operation_id
    source = (
        discovery_metadata(op, "completed", reason="window-complete")
        if kind == "discovery"
        else command_metadata(op, "running", result={"json": "private"})
    )
    concluded = documents.concluded_metadata(source, status, code, documents.KIND_RULES[kind])
    assert concluded["status"] == status.value
    assert not {"result", "reason", "retry_after_seconds"} & set(concluded)
    for key, value in expected.items():
        if isinstance(value, dict):
            assert concluded[key]["code"] == value["code"] and concluded[key]["message"]
        else:
            assert concluded[key] == value
    if not expected:
        assert "error" not in concluded and "error_code" not in concluded


def test_kind_and_transport_come_from_the_durable_metadata() -> None:
    scan, command = record(), record(kind="command")
    assert (documents.kind_of(scan), documents.transport_of(scan)) == ("discovery", "ble")
    assert (documents.kind_of(command), documents.transport_of(command)) == ("command", None)


@pytest.mark.parametrize("status", ["completed", "failed", "timed-out", "cancelled", "expired", "unknown"])
def test_every_terminal_status_with_causal_context_projects_to_a_receipt(status: str) -> None:
    document = {
        "operation/id": "deferred:sensorium.directive.invoke:" + "D" * 26,
        "status": status,
        "updated_at": "2027-01-01T12:00:09.000Z",
        "causal/context": {"operation/id": "causal:flow-3", "parent/operation-id": "causal:flow", "x": 1},
        "result": {"json": "never in a receipt"},
    }
    receipt = execution_receipt(document)
    assert receipt is not None
    check("execution-receipt.v1", receipt)
    assert receipt["operation/id"] == "causal:flow-3"
    assert receipt["deferred_operation/id"] == document["operation/id"]
    assert receipt["finished_at"] == "2027-01-01T12:00:09.000Z"
    assert receipt["causal/context"] == document["causal/context"]
    assert "never in a receipt" not in str(receipt)


def test_no_receipt_without_an_end_or_a_causal_context() -> None:
    base = {"operation/id": "x", "status": "completed", "updated_at": "2027-01-01T12:00:00Z"}
    assert execution_receipt(base) is None
    assert execution_receipt({**base, "status": "running", "causal/context": {"operation/id": "c"}}) is None
    with pytest.raises(ValueError):
        execution_receipt({"operation/id": "x", "status": "failed", "causal/context": {"operation/id": "c"}})


def test_a_recorded_receipt_finishes_at_the_first_terminal_event() -> None:
    row = record(status="completed", causal_context={"operation/id": "c"}, updated_at=T0 + timedelta(hours=1))
    history = [
        HistoryEvent(1, T0, "pending", "a" * 64),
        HistoryEvent(2, T0 + timedelta(seconds=5), "completed", "b" * 64),
        HistoryEvent(3, T0 + timedelta(minutes=9), "completed", "c" * 64),
    ]
    assert finished_at(row, history) == T0 + timedelta(seconds=5)
    receipt = record_receipt(row, history)
    assert receipt is not None and receipt["finished_at"] == "2027-01-01T12:00:05.000Z"
    check("execution-receipt.v1", receipt)
    assert record_receipt(record(status="running", causal_context={"operation/id": "c"}), history) is None
    assert record_receipt(record(status="completed"), history) is None
