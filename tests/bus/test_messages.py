"""The pure Bus messages: subjects, request parsing, the state mapping and the envelopes."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from connector.bus.messages import (
    LIFECYCLE_KEYS,
    Subjects,
    bearer_token,
    decode_reply,
    done_message,
    encode,
    envelope,
    handle_of,
    is_retained,
    is_sync_directive,
    is_valid_op,
    parse_op,
    parse_start,
    peek_op,
    record_state,
    refusal,
)
from connector.core.lifecycle import BusState, Status
from connector.errors import SensoriumError
from connector.storage.registry import OperationRecord

NOW = datetime(2027, 1, 1, 12, 0, tzinfo=UTC)
OP_ID = "deferred:sensorium.directive.invoke:" + "A" * 26
SECRET = "SECRET-VALUE-7731"


def record(**changes: Any) -> OperationRecord:
    """A discovery record as the host keeps it; keyword arguments replace fields."""
    base = OperationRecord(
        operation_id=OP_ID,
        operation_kind="sensorium.directive.invoke",
        owner_module_id="sensorium-os",
        capability_id="device.discovery.scan",
        owner="alice",
        status="running",
        retry_after_seconds=1,
        next_poll_at=NOW,
        expires_at=NOW + timedelta(minutes=5),
        attempts=2,
        cancelable=True,
        cancel_unavailable_reason=None,
        correlation_id=None,
        continuation_digest=None,
        diagnostics_digest=None,
        last_error=None,
        created_at=NOW - timedelta(seconds=3),
        updated_at=NOW,
        bus_op=None,
        metadata={
            "operation/id": OP_ID,
            "status": "running",
            "owner": "alice",
            "scope": {"transport": "ble", "window_seconds": 5},
            "disclosed_count": 2,
            "cleanup": {"state": "pending", "claim": "held"},
        },
    )
    return replace(base, **changes)


# ---- subjects and requests ---------------------------------------------------------------------------------


def test_subjects_follow_the_service_name() -> None:
    assert Subjects.for_service() == Subjects(
        "sensorium-os.op.start", "sensorium-os.op.get", "sensorium-os.op.cancel", "sensorium-os.op.done"
    )
    assert Subjects.for_service("lab.os").done == "lab.os.op.done"
    for bad in ("", "a b", "a.>", "*", "a..b", "x" * 65):
        with pytest.raises(ValueError):
            Subjects.for_service(bad)


def test_bearer_token_from_headers() -> None:
    assert bearer_token({"Authorization": "Bearer abc"}) == "abc"
    assert bearer_token({"authorization": "bearer  abc "}) == "abc"
    assert bearer_token({"Authorization": "Basic abc"}) is None
    assert bearer_token({"Authorization": "Bearer "}) is None
    assert bearer_token(None) is None and bearer_token({}) is None


def test_op_handles() -> None:
    assert is_valid_op("build-42") and is_valid_op(OP_ID) and is_valid_op("a/b.c_d:e")
    for bad in ("", "-lead", "a b", "x" * 129, "é", 7, None, "a\nb"):
        assert not is_valid_op(bad)


def test_parse_start() -> None:
    request = parse_start(b'{"op": "job-1", "directive": {"action_id": "x"}}')
    assert request.op == "job-1" and request.directive == {"action_id": "x"}
    assert parse_start(b'{"directive": 1}').op is None


@pytest.mark.parametrize(
    ("data", "code", "message"),
    [
        (b"{nope", "invalid-json", None),
        (b"[1]", "invalid-input", "/: object-required"),
        (b'{"directive": {}, "extra": "' + SECRET.encode() + b'"}', "invalid-input", "/: closed-object"),
        (b'{"op": "' + SECRET.encode() + b' x", "directive": {}}', "invalid-input", "/op: handle-pattern"),
        (b'{"op": "job"}', "invalid-input", "/directive: required"),
        (b'{"op": "' + b"x" * 70000 + b'"}', "body-too-large", None),
    ],
)
def test_parse_start_refusals_never_echo_values(data: bytes, code: str, message: str | None) -> None:
    with pytest.raises(SensoriumError) as refused:
        parse_start(data)
    assert refused.value.code == code
    if message is not None:
        assert refused.value.diagnostics == ({"code": "invalid-input", "message": message},)
    assert SECRET not in json.dumps(refused.value.to_document())


def test_parse_op() -> None:
    assert parse_op(b'{"op": "job-1"}') == "job-1"
    for data in (b"{}", b'{"op": 3}', b'{"op": "job", "x": 1}', b"null"):
        with pytest.raises(SensoriumError) as refused:
            parse_op(data)
        assert refused.value.code == "invalid-input"


def test_peek_op_echoes_well_formed_handles_only() -> None:
    assert peek_op(b'{"op": "job-1", "junk": true}') == "job-1"
    assert peek_op(b'{"op": "bad op"}') is None
    assert peek_op(b"{nope") is None and peek_op(b"[]") is None


def test_sync_directives_are_recognised() -> None:
    assert is_sync_directive({"timing": {"mode": "sync"}})
    assert not is_sync_directive({"timing": {"mode": "async"}})
    assert not is_sync_directive({"timing": "sync"}) and not is_sync_directive(None)


# ---- states ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "last_error", "metadata_reason", "state", "reason"),
    [
        ("pending", None, None, BusState.QUEUED, None),
        ("running", None, None, BusState.RUNNING, None),
        ("completed", None, "limit-reached", BusState.DONE, "limit-reached"),
        ("completed", None, None, BusState.DONE, None),
        ("failed", "provider-unavailable", None, BusState.FAILED, "provider-unavailable"),
        ("failed", None, None, BusState.FAILED, "failed"),
        ("timed-out", "deadline-exceeded", None, BusState.FAILED, "timed-out"),
        ("expired", None, None, BusState.FAILED, "expired"),
        ("cancelled", None, None, BusState.CANCELLED, None),
        ("failed", "interrupted-by-restart", None, BusState.LOST, "interrupted-by-restart"),
        ("unknown", None, None, BusState.LOST, "unknown-operation"),
    ],
)
def test_record_state(
    status: str, last_error: str | None, metadata_reason: str | None, state: BusState, reason: str | None
) -> None:
    metadata = {"reason": metadata_reason} if metadata_reason else {}
    assert record_state(record(status=status, last_error=last_error, metadata=metadata)) == (state, reason)


def test_retention_hides_old_terminal_records_only() -> None:
    week = timedelta(days=7)
    old = NOW - week - timedelta(seconds=1)
    assert is_retained(record(status="completed", updated_at=NOW - week), now=NOW, retention=week)
    assert not is_retained(record(status="completed", updated_at=old), now=NOW, retention=week)
    assert is_retained(record(status="running", updated_at=old), now=NOW, retention=week)


def test_handle_is_the_callers_op_or_the_operation_id() -> None:
    assert handle_of(record()) == OP_ID
    assert handle_of(record(bus_op="job-1")) == "job-1"


# ---- envelopes ---------------------------------------------------------------------------------------------


def test_get_envelope_is_the_durable_projection_without_private_keys() -> None:
    metadata = {
        **record().metadata,
        "progress": {"snapshot": SECRET},
        "result": {"candidates": [SECRET]},
        "snapshot": SECRET,
        "candidates": [SECRET],
        "schema": "deferred-operation-status.v1",
        "retry_after_seconds": 1,
        "state": "forged",
        "op": "forged",
    }
    document = envelope("job-1", record(metadata=metadata), full=True)
    assert SECRET not in json.dumps(document)
    assert document["op"] == "job-1" and document["state"] == "running"
    assert document["operation/id"] == OP_ID and document["action_id"] == "device.discovery.scan"
    assert document["scope"] == {"transport": "ble", "window_seconds": 5}
    assert document["disclosed_count"] == 2 and document["owner"] == "alice"
    assert document["created_at"] == "2027-01-01T11:59:57.000Z"
    assert "schema" not in document and "retry_after_seconds" not in document and "reason" not in document


def test_done_message_carries_lifecycle_fields_only() -> None:
    done = record(
        status="failed",
        last_error="provider-failure",
        bus_op="job-9",
        metadata={**record().metadata, "error_code": "provider-failure", "causal/context": {"x": 1}},
    )
    message = done_message(done)
    assert (message["op"], message["state"], message["reason"]) == ("job-9", "failed", "provider-failure")
    assert set(message) - {"op", "state", "reason"} <= set(LIFECYCLE_KEYS)
    assert "owner" not in message and "scope" not in message and "causal/context" not in message
    assert message["error_code"] == "provider-failure"
    assert message["cleanup"] == {"state": "pending", "claim": "held"}


def test_refusal_shape_and_round_trip() -> None:
    error = SensoriumError("missing, unknown or revoked bearer token", code="unauthenticated")
    document = refusal("job-1", error)
    assert document == {"op": "job-1", "state": "unknown", "error": error.to_document()}
    assert decode_reply(encode(document)) == document
    for data in (b"{", b"[]", b'{"op": "x"}'):
        with pytest.raises(SensoriumError):
            decode_reply(data)


def test_status_enum_covers_every_registry_status() -> None:
    for status in Status:
        state, _ = record_state(record(status=status.value))
        assert state in BusState
