"""The caller-private v2 status and the durable metadata of a discovery (CONTRACT §1, 6.4, 6.7, 6.8, 7)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

import pytest

from connector.contract.validate import validate
from connector.core.projections import SessionView, caller_status_v2, durable_metadata
from connector.core.snapshot import CandidateTable, Revision
from tests.core.builders import CATALOG_PROFILE, HR_UUID, T0, ble, ref_factory, scope_of

OP_ID = "deferred:sensorium.directive.invoke:ABCDEFGHIJKLMNOPQRSTUVWXYZ"
STATUS = "deferred-operation-status.v2"
CANARIES = {
    "name": "CanaryStrap-5e1f",
    "name_prefix": "CanaryStr",
    "excluded_prefix": "CanaryHidden-77",
    "address": "C2:CA:FE:00:00:01",
    "excluded_address": "C2:CA:FE:00:00:02",
    "generation": "gen-canary-9d2",
}
SCOPE = scope_of(
    {
        "transport": "ble",
        "filters": {
            "service_uuids": [HR_UUID],
            "name_prefix": CANARIES["name_prefix"],
            "addresses": [CANARIES["address"]],
        },
        "exclusions": {
            "name_prefix": CANARIES["excluded_prefix"],
            "addresses": [CANARIES["excluded_address"]],
        },
    }
)


def _revisions() -> list[Revision]:
    table = CandidateTable(
        SCOPE, CATALOG_PROFILE, generation=CANARIES["generation"], new_ref=ref_factory("cref")
    )
    cuts = []
    for step, rssi in enumerate((-60, -55)):
        now = T0 + 1000 * step
        table.ingest(ble(CANARIES["address"], rssi, name=CANARIES["name"], service_uuids=(HR_UUID,)), now)
        revision = table.cut(now)
        assert revision is not None
        cuts.append(revision)
    return cuts


FIRST, SECOND = _revisions()
CANARIES["ref"] = FIRST.candidates[0]["candidate/ref"]

RUNNING = SessionView(
    operation_id=OP_ID,
    operation_kind="sensorium.directive.invoke",
    owner="caller-canary-owner",
    action_id="device.discovery.scan",
    scope=SCOPE,
    status="running",
    created_at_ms=T0,
    updated_at_ms=T0 + 1000,
    expires_at_ms=T0 + 300_000,
    retry_after_seconds=1,
    reason=None,
    error_code=None,
    cancellation_state=None,
    cancellation_requested_at_ms=None,
    cancellation_confirmed_at_ms=None,
    cleanup_state="pending",
    claim="held",
    latest=FIRST,
    final_revision=1,
    erased_at_ms=None,
    disclosed_count=1,
    causal_context={"operation/id": "flow-op-1", "trace/id": "trace-1"},
)


def view(**changes: Any) -> SessionView:
    """The running view with changes."""
    return dataclasses.replace(RUNNING, **changes)


DONE = {"retry_after_seconds": None, "cleanup_state": "confirmed", "claim": "released"}
PENDING = view(status="pending", latest=None, final_revision=0, updated_at_ms=T0, disclosed_count=0)
COMPLETED = view(status="completed", reason="window-complete", latest=SECOND, final_revision=2, **DONE)
CANCEL_REQUESTED = view(cancellation_state="requested", cancellation_requested_at_ms=T0 + 1500)
SHAPES: dict[str, SessionView] = {
    "pending": PENDING,
    "running": RUNNING,
    "running-cancel-requested": CANCEL_REQUESTED,
    "completed": COMPLETED,
    "completed-limit": dataclasses.replace(COMPLETED, reason="limit-reached"),
    "completed-deadline": dataclasses.replace(COMPLETED, reason="deadline-reached"),
    "completed-no-revision": dataclasses.replace(COMPLETED, latest=None, final_revision=0),
    "completed-erased": dataclasses.replace(COMPLETED, latest=None, erased_at_ms=T0 + 600_000),
    "cancelled": view(
        status="cancelled",
        cancellation_state="confirmed",
        cancellation_requested_at_ms=T0 + 1500,
        cancellation_confirmed_at_ms=T0 + 1600,
        **DONE,
    ),
    "failed-provider": view(
        status="failed", error_code="provider-unavailable", latest=None, final_revision=0, **DONE
    ),
    "failed-cancel-unconfirmed": view(
        status="failed",
        error_code="cancellation-unconfirmed",
        cancellation_state="uncertain",
        cancellation_requested_at_ms=T0 + 1500,
        retry_after_seconds=None,
        cleanup_state="uncertain",
        claim="held",
    ),
    "failed-cleanup-unconfirmed": view(
        status="failed", error_code="cleanup-unconfirmed", retry_after_seconds=None, cleanup_state="uncertain"
    ),
    "timed-out": view(status="timed-out", latest=None, **DONE),
    "expired": view(status="expired", error_code=None, latest=None, **DONE),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_status_shape_passes_the_contract(name: str) -> None:
    document = caller_status_v2(SHAPES[name])
    assert validate(STATUS, document, via="schema") == []
    assert validate(STATUS, document, via="model") == []
    assert document["diagnostics"] == []
    assert document["causal/context"] == {"operation/id": "flow-op-1", "trace/id": "trace-1"}


def test_running_carries_progress_and_retry() -> None:
    document = caller_status_v2(RUNNING)
    assert document["retry_after_seconds"] == 1
    assert document["progress"] == {
        "type": "sensorium-device-discovery-progress.v1",
        "revision": 1,
        "generation": CANARIES["generation"],
        "snapshot": {"candidates": list(FIRST.candidates)},
        "bounds": {"max_candidates": 64, "max_snapshot_bytes": 65536},
    }
    assert document["cleanup"] == {"state": "pending", "claim": "held"}
    assert "result" not in document and "error" not in document and "cancellation" not in document
    assert document["updated_at"] == "2026-11-30T12:00:01Z"
    assert document["expires_at"] == "2026-11-30T12:05:00Z"


def test_pending_has_no_progress() -> None:
    document = caller_status_v2(PENDING)
    assert "progress" not in document and document["retry_after_seconds"] == 1


def test_no_progress_while_cancellation_is_requested() -> None:
    document = caller_status_v2(CANCEL_REQUESTED)
    assert "progress" not in document
    assert document["cancellation"] == {"state": "requested", "requested_at": "2026-11-30T12:00:01.500Z"}
    assert document["status"] == "running"


def test_completed_result_equals_the_final_snapshot() -> None:
    document = caller_status_v2(COMPLETED)
    assert "retry_after_seconds" not in document
    assert document["result"] == {
        "schema": "sensorium-device-discovery-result.v1",
        "reason": "window-complete",
        "partial": False,
        "final_revision": 2,
        "candidates": document["progress"]["snapshot"]["candidates"],
    }
    assert document["progress"]["revision"] == 2
    assert document["cleanup"] == {"state": "confirmed", "claim": "released"}
    limited = caller_status_v2(SHAPES["completed-limit"])["result"]
    assert (limited["reason"], limited["partial"]) == ("limit-reached", True)
    deadline = caller_status_v2(SHAPES["completed-deadline"])["result"]
    assert (deadline["reason"], deadline["partial"]) == ("deadline-reached", True)


def test_completed_without_any_revision() -> None:
    document = caller_status_v2(SHAPES["completed-no-revision"])
    assert "progress" not in document
    assert document["result"]["final_revision"] == 0
    assert document["result"]["candidates"] == []


def test_erased_result_keeps_reason_and_final_revision() -> None:
    document = caller_status_v2(SHAPES["completed-erased"])
    assert "progress" not in document
    assert document["result"] == {
        "schema": "sensorium-device-discovery-result.v1",
        "reason": "window-complete",
        "partial": False,
        "final_revision": 2,
        "candidates": [],
        "erased_at": "2026-11-30T12:10:00Z",
    }


def test_failures_carry_error_and_cleanup() -> None:
    unconfirmed = caller_status_v2(SHAPES["failed-cancel-unconfirmed"])
    assert unconfirmed["error"] == {
        "code": "cancellation-unconfirmed",
        "message": "the scan did not confirm its stop after cancellation",
    }
    assert unconfirmed["cancellation"] == {"state": "uncertain", "requested_at": "2026-11-30T12:00:01.500Z"}
    assert unconfirmed["cleanup"] == {"state": "uncertain", "claim": "held"}
    assert "progress" not in unconfirmed and "retry_after_seconds" not in unconfirmed
    assert caller_status_v2(SHAPES["timed-out"])["error"]["code"] == "deadline-exceeded"
    assert caller_status_v2(SHAPES["expired"])["error"]["code"] == "deadline-exceeded"
    assert caller_status_v2(SHAPES["failed-provider"])["error"]["code"] == "provider-unavailable"


def test_cancelled_is_confirmed_with_a_released_claim() -> None:
    document = caller_status_v2(SHAPES["cancelled"])
    assert document["cancellation"] == {
        "state": "confirmed",
        "requested_at": "2026-11-30T12:00:01.500Z",
        "confirmed_at": "2026-11-30T12:00:01.600Z",
    }
    assert document["cleanup"] == {"state": "confirmed", "claim": "released"}
    assert "progress" not in document and "error" not in document


def test_retry_after_never_on_a_terminal_status_even_if_the_view_has_one() -> None:
    document = caller_status_v2(dataclasses.replace(COMPLETED, retry_after_seconds=5))
    assert "retry_after_seconds" not in document


@pytest.mark.parametrize(
    "sequence",
    [
        ["pending", "running", "completed", "completed-erased"],
        ["pending", "running", "running-cancel-requested", "cancelled"],
        ["running", "running-cancel-requested", "failed-cancel-unconfirmed"],
        ["pending", "failed-provider"],
    ],
)
def test_poll_sequences_pass_the_cross_poll_rules(sequence: list[str]) -> None:
    polls = [caller_status_v2(SHAPES[name]) for name in sequence]
    assert validate(STATUS, polls, via="schema") == []


# -- durable metadata ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_durable_metadata_holds_no_candidate_data(name: str) -> None:
    metadata = durable_metadata(SHAPES[name])
    encoded = json.dumps(metadata)
    for canary in CANARIES.values():
        assert canary not in encoded
        assert canary.lower() not in encoded.lower()
        assert hashlib.sha256(canary.encode()).hexdigest() not in encoded
    assert not {"progress", "result", "candidates", "snapshot", "final_revision"} & set(metadata)


def test_durable_metadata_shape() -> None:
    assert durable_metadata(SHAPES["failed-cancel-unconfirmed"]) == {
        "operation/id": OP_ID,
        "operation/kind": "sensorium.directive.invoke",
        "owner": "caller-canary-owner",
        "action_id": "device.discovery.scan",
        "status": "failed",
        "created_at": "2026-11-30T12:00:00Z",
        "updated_at": "2026-11-30T12:00:01Z",
        "expires_at": "2026-11-30T12:05:00Z",
        "scope": {
            "transport": "ble",
            "window_seconds": 10,
            "limits": {"max_candidates": 64, "max_snapshot_bytes": 65536},
            "filters": {"service_uuids": [HR_UUID]},
            "filters_redacted": ["name_prefix"],
            "exclusions": ["name_prefix"],
        },
        "error_code": "cancellation-unconfirmed",
        "disclosed_count": 1,
        "cancellation": {"state": "uncertain", "requested_at": "2026-11-30T12:00:01.500Z"},
        "cleanup": {"state": "uncertain", "claim": "held"},
    }
    completed = durable_metadata(SHAPES["completed-erased"])
    assert completed["reason"] == "window-complete"
    assert completed["erased_at"] == "2026-11-30T12:10:00Z"
    assert "error_code" not in completed
