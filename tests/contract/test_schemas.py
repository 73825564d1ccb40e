"""The schema files themselves: well-formed, closed, consistent with the models and the shared patterns."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from connector.contract import patterns
from connector.contract.models import MODELS
from connector.contract.schemas import (
    SCHEMA_DIR,
    UnknownSchemaError,
    schema_document,
    schema_names,
    schema_violations,
)
from connector.contract.violations import Violation

MINE = [name for name in schema_names() if "catalog" not in name]
OPEN_OBJECTS = {
    # Open by CONTRACT §1 (causal/context, diagnostics[] items, input, extensions) and a continuation's own
    # values.
    "common.defs.json#/$defs/causalContext",
    "common.defs.json#/$defs/diagnostics/items",
    "common.defs.json#/$defs/extensions",
    "sensorium-directive.v1.schema.json#/properties/input",
    "orbiplex-continuation.v1.schema.json#/properties/context",
    "orbiplex-continuation.v1.schema.json#/properties/envelope",
}
OPERATION_ID = "deferred:sensorium.directive.invoke:7QKZ4N2VXD5TRM3WBYH6JCLPAE"


def _files() -> list[str]:
    return sorted(p.name for p in SCHEMA_DIR.glob("*.json"))


def _objects(node: Any, at: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every subschema that describes an object, with its location (an `if` only tests, it describes none)."""
    if isinstance(node, dict):
        if node.get("type") == "object":
            yield at, node
        for key, value in node.items():
            if key != "if":
                yield from _objects(value, f"{at}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _objects(value, f"{at}/{i}")


@pytest.mark.parametrize("file_name", _files())
def test_schema_file_is_valid_draft_2020_12(file_name: str) -> None:
    schema = json.loads((SCHEMA_DIR / file_name).read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://sensorium.invalid/schemas/{file_name}"


@pytest.mark.parametrize("name", schema_names())
def test_schema_names_its_document(name: str) -> None:
    schema = schema_document(name)
    assert schema["title"] == name
    assert schema["properties"]["schema"] == {"const": name}
    assert "schema" in schema["required"]
    assert schema["additionalProperties"] is False
    assert "extensions" in schema["properties"]


@pytest.mark.parametrize("file_name", [f for f in _files() if "catalog" not in f])
def test_every_object_is_closed_unless_spec_opens_it(file_name: str) -> None:
    schema = json.loads((SCHEMA_DIR / file_name).read_text(encoding="utf-8"))
    for at, node in _objects(schema, f"{file_name}#"):
        if at in OPEN_OBJECTS:
            assert "additionalProperties" not in node
        else:
            assert node.get("additionalProperties") is False, at


def test_models_cover_every_schema() -> None:
    assert set(MODELS) == set(schema_names())


def test_shared_patterns_match_the_schemas() -> None:
    defs = json.loads((SCHEMA_DIR / "common.defs.json").read_text(encoding="utf-8"))["$defs"]
    assert defs["time"]["pattern"] == patterns.TIME_PATTERN
    assert defs["operationId"]["pattern"] == patterns.OPERATION_ID_PATTERN
    assert defs["operationKind"]["pattern"] == patterns.OPERATION_KIND_PATTERN
    assert defs["actionId"]["pattern"] == patterns.ACTION_ID_PATTERN
    assert defs["errorCode"]["pattern"] == patterns.ERROR_CODE_PATTERN
    assert defs["path"]["pattern"] == patterns.PATH_PATTERN
    assert defs["ble"]["properties"]["service_uuids"]["items"]["pattern"] == patterns.UUID_PATTERN
    assert defs["count"]["maximum"] == patterns.MAX_SAFE_INT


def test_unknown_schema_name_is_refused() -> None:
    with pytest.raises(UnknownSchemaError):
        schema_violations("deferred-operation-status.v3", {})


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("/v1/operations/x", True),
        ("/", True),
        ("//example.invalid/x", False),
        ("https://example.invalid/x", False),
        ("v1/operations", False),
        ("/v1/operations /x", False),
        ("/v1/\u00e9", False),
        ("/v1/operations\n", False),
    ],
)
def test_status_path_is_origin_relative(value: str, ok: bool) -> None:
    doc = {
        "schema": "sensorium-connector-deferred.v1",
        "connector_operation/id": OPERATION_ID,
        "action_id": "device.discovery.scan",
        "retry_after_seconds": 1,
        "status_path": value,
        "cancel/unavailable-reason": "not cancelable",
    }
    found = schema_violations("sensorium-connector-deferred.v1", doc)
    assert found == ([] if ok else [Violation("/status_path", "schema")])


@pytest.mark.parametrize("value", [1.0, True, "1", 10**17])
def test_integers_are_plain_safe_integers(value: object) -> None:
    doc = {
        "schema": "sensorium-error.v1",
        "code": "too-many-operations",
        "message": "m",
        "retry_after_seconds": value,
    }
    assert schema_violations("sensorium-error.v1", doc) == [Violation("/retry_after_seconds", "schema")]


def test_integers_stay_plain_behind_a_reference_into_another_schema_file() -> None:
    # result -> candidate schema (a file naming its $schema) -> common.defs uint16: the wire rules hold.
    path = SCHEMA_DIR / "vectors/sensorium-device-discovery-result.v1/valid/window-complete.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["candidates"][0]["ble"]["manufacturer_ids"][0] = 0.0
    found = schema_violations("sensorium-device-discovery-result.v1", doc)
    assert found == [Violation("/candidates/0/ble/manufacturer_ids/0", "schema")]


def test_required_members_are_pointed_at_one_by_one() -> None:
    found = schema_violations("sensorium-error.v1", {"schema": "sensorium-error.v1"})
    assert found == [Violation("/code", "schema"), Violation("/message", "schema")]


def test_unknown_member_names_the_object_not_the_key() -> None:
    doc = {"schema": "sensorium-error.v1", "code": "internal", "message": "m", "secret-name": 1}
    assert schema_violations("sensorium-error.v1", doc) == [Violation("", "schema")]


def test_rule_names_reach_through_references() -> None:
    candidate = {
        "schema": "sensorium-device-discovery-candidate.v1",
        "candidate/ref": "cr_1",
        "transport": "usb-serial",
        "generation": "gen_1",
        "first_seen_at": "2026-11-30T10:00:00Z",
        "last_seen_at": "2026-11-30T10:00:00Z",
        "expires_at": "2026-11-30T10:00:30Z",
        "mdns": {"instance": "x"},
    }
    result = {
        "schema": "sensorium-device-discovery-result.v1",
        "reason": "window-complete",
        "partial": False,
        "final_revision": 1,
        "candidates": [candidate],
    }
    found = schema_violations("sensorium-device-discovery-result.v1", result)
    assert found == [Violation("/candidates/0/mdns", "detail-matches-transport")]


@pytest.mark.parametrize("name", MINE)
def test_non_objects_are_refused_without_crashing(name: str) -> None:
    document: object
    for document in (None, 1, "text", [], True):
        assert schema_violations(name, document) == [Violation("", "schema")]
