"""The pydantic models: wire round trips, construction by field name, aliases only on the wire."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from connector.contract.models import (
    MODELS,
    Cleanup,
    DeferredOperationStatusV2,
    DirectiveValue,
    ExecutionReceipt,
    validate_wire,
)
from connector.contract.schemas import UnknownSchemaError
from tests.contract.vectors import CATALOG_SCHEMAS, VECTORS, Vector

OPERATION_ID = "deferred:sensorium.directive.invoke:7QKZ4N2VXD5TRM3WBYH6JCLPAE"
VALID_MINE = [v for v in VECTORS if v.valid and v.schema not in CATALOG_SCHEMAS]


def _polls(vector: Vector) -> list[Any]:
    document = vector.document()
    return document if isinstance(document, list) else [document]


@pytest.mark.parametrize("vector", VALID_MINE, ids=lambda v: v.id)
def test_valid_documents_round_trip_unchanged(vector: Vector) -> None:
    for document in _polls(vector):
        assert validate_wire(vector.schema, document).to_wire() == document  # type: ignore[attr-defined]


def test_models_are_built_by_field_name_and_serialised_by_alias() -> None:
    receipt = ExecutionReceipt(
        schema_="execution-receipt.v1",
        operation_id="op:flow-demo-42",
        deferred_operation_id=OPERATION_ID,
        status="completed",
        finished_at="2026-11-30T10:00:11Z",
    )
    assert receipt.to_wire() == {
        "schema": "execution-receipt.v1",
        "operation/id": "op:flow-demo-42",
        "deferred_operation/id": OPERATION_ID,
        "status": "completed",
        "finished_at": "2026-11-30T10:00:11Z",
    }


def test_an_explicit_json_null_survives_serialisation() -> None:
    assert DirectiveValue(value=None).to_wire() == {"json": None}


def test_wire_input_accepts_aliases_only() -> None:
    document = {
        "schema": "execution-receipt.v1",
        "operation_id": "op:flow-demo-42",
        "deferred_operation/id": OPERATION_ID,
        "status": "completed",
        "finished_at": "2026-11-30T10:00:11Z",
    }
    with pytest.raises(ValidationError) as raised:
        validate_wire("execution-receipt.v1", document)
    assert {e["type"] for e in raised.value.errors()} == {"missing", "extra_forbidden"}


def test_optional_members_are_absent_never_null() -> None:
    with pytest.raises(ValidationError):
        Cleanup(state="confirmed", claim=None)  # type: ignore[arg-type]


def test_models_are_frozen() -> None:
    cleanup = Cleanup(state="pending", claim="held")
    with pytest.raises(ValidationError):
        cleanup.state = "confirmed"  # type: ignore[misc]


def test_a_v2_status_exposes_typed_parts() -> None:
    vector = next(v for v in VALID_MINE if v.path.stem == "completed-window")
    status = validate_wire(vector.schema, vector.document())
    assert isinstance(status, DeferredOperationStatusV2)
    assert status.progress is not None and status.result is not None and status.cleanup is not None
    assert status.result.final_revision == status.progress.revision
    assert [c.candidate_ref for c in status.result.candidates] == [
        c.candidate_ref for c in status.progress.snapshot.candidates
    ]


def test_unknown_model_name_is_refused() -> None:
    assert "deferred-operation-status.v3" not in MODELS
    with pytest.raises(UnknownSchemaError):
        validate_wire("deferred-operation-status.v3", {})
