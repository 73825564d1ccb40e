"""The served `/openapi.json` (CONTRACT §9): 3.1, every route declared, bodies from the canonical schemas.

The components are generated from `schemas/`; here every schema vector is judged through both, and the two
must fail at the same places with the same keywords: the document is not a second, drifting copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openapi_python_client.schema import OpenAPI
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from connector.api.openapi import (
    ADMISSION_REFUSALS,
    COMPONENTS,
    EDGE_REFUSALS,
    RETRY_AFTER_CODES,
    component_name,
)
from connector.contract.schemas import schema_document, schema_files, schema_names, wire_validator
from connector.errors import HTTP_STATUS_BY_CODE
from tests.contract.vectors import all_vectors
from tests.host.support import host_app

DOC = "urn:sensorium:openapi-test"
KIND = "sensorium.directive.invoke"
OPEN_ROUTES = {("get", "/healthz"), ("get", "/metrics")}


async def served(tmp_path: Path) -> dict[str, Any]:
    """The document of a connector with the reference host's routes mounted."""
    async with host_app(tmp_path / "data") as (_, client):
        response = await client.get("/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, p, op) for p, methods in document["paths"].items() for m, op in methods.items()]


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if isinstance(node.get("$ref"), str) else []
        return own + [r for value in node.values() for r in _refs(value)]
    return [r for item in node for r in _refs(item)] if isinstance(node, list) else []


@pytest.mark.asyncio
async def test_a_valid_openapi_31_document_a_generator_reads(tmp_path: Path) -> None:
    document = await served(tmp_path)
    assert document["openapi"].startswith("3.1.")
    OpenAPI.model_validate(document)  # the generator's own model of the specification
    schemas = document["components"]["schemas"]
    assert not {"HTTPValidationError", "ValidationError"} & set(schemas)
    for ref in _refs(document):
        assert ref.startswith(COMPONENTS) and ref.removeprefix(COMPONENTS) in schemas, ref
    assert {component_name(f) for f in schema_files()} - {"common.defs"} <= set(schemas)
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "a principal's token (CONTRACT §8)",
    }


@pytest.mark.asyncio
async def test_every_operation_declares_its_answers(tmp_path: Path) -> None:
    document = await served(tmp_path)
    operations = _operations(document)
    assert {p for _, p, _ in operations} >= {
        "/v1/directives",
        "/v1/operations/{operation_id}",
        "/v1/bindings",
        "/v1/host/directives",
        "/v1/admin/deferred-operations",
    }
    for method, path, operation in operations:
        responses = operation["responses"]
        assert all(r["description"] != "Successful Response" for r in responses.values()), path
        assert "500" in responses, (method, path)
        assert ("security" in operation) == ((method, path) not in OPEN_ROUTES), (method, path)
        if "security" in operation:
            assert "401" in responses
        for status, response in responses.items():
            if int(status) < 400 or (path, status) == ("/healthz", "503"):
                continue
            schema = response["content"]["application/json"]["schema"]
            assert schema["$ref"] == COMPONENTS + "sensorium-error.v1"
            codes = schema["properties"]["code"]["enum"]
            assert all(HTTP_STATUS_BY_CODE[code] == int(status) for code in codes)
            if set(codes) & RETRY_AFTER_CODES:
                assert "Retry-After" in response["headers"]


def _refusal_codes(operation: dict[str, Any]) -> set[str]:
    return {
        code
        for status, response in operation["responses"].items()
        if int(status) >= 400
        for code in response["content"]["application/json"]["schema"]["properties"]["code"]["enum"]
    }


@pytest.mark.asyncio
async def test_both_admission_routes_declare_the_one_admission_refusal_list(tmp_path: Path) -> None:
    paths = (await served(tmp_path))["paths"]
    invoke, admit = paths["/v1/directives"]["post"], paths["/v1/host/directives"]["post"]
    assert _refusal_codes(invoke) == _refusal_codes(admit) == {*ADMISSION_REFUSALS, *EDGE_REFUSALS}


@pytest.mark.asyncio
async def test_deferred_handles_metrics_and_bodies(tmp_path: Path) -> None:
    document = await served(tmp_path)
    paths = document["paths"]
    for path, handle in (
        ("/v1/directives", "sensorium-connector-deferred.v1"),
        ("/v1/host/directives", "deferred-operation.v1"),
    ):
        operation = paths[path]["post"]
        accepted = operation["responses"]["202"]
        assert accepted["content"]["application/json"]["schema"] == {"$ref": COMPONENTS + handle}
        assert accepted["headers"]["Location"]["required"] and accepted["headers"]["Retry-After"]["required"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": COMPONENTS + "sensorium-directive.v1"}
        assert set(operation["responses"]) >= {
            "200",
            "202",
            "400",
            "401",
            "403",
            "404",
            "409",
            "413",
            "422",
            "429",
        }
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    status = paths["/v1/operations/{operation_id}"]["get"]
    wait = next(p for p in status["parameters"] if p["name"] == "wait_seconds")
    assert wait["schema"]["type"] == "integer" and wait["schema"]["minimum"] == 0
    bind = paths["/v1/operations/{operation_id}/bindings"]["post"]["responses"]
    assert bind["201"]["content"]["application/json"]["schema"] == {
        "$ref": COMPONENTS + "sensorium-device-binding.v1"
    }
    assert set(bind["409"]["content"]["application/json"]["schema"]["properties"]["code"]["enum"]) >= {
        "session-not-terminated",
        "not-bindable",
        "candidate-consumed",
        "transport-claimed",
    }


def _errors(validator: Any, instance: Any) -> list[tuple[str, str]]:
    found = [("/".join(map(str, e.absolute_path)), str(e.validator)) for e in validator.iter_errors(instance)]
    return sorted(found)


@pytest.mark.asyncio
async def test_components_judge_every_vector_as_the_canonical_schemas_do(tmp_path: Path) -> None:
    document = await served(tmp_path)
    registry: Registry[Any] = Registry().with_resource(DOC, DRAFT202012.create_resource(document))
    judged = 0
    for vector in all_vectors():
        if vector.schema not in schema_names():
            continue
        canonical = wire_validator(schema_document(vector.schema))
        component = wire_validator({"$ref": f"{DOC}#/components/schemas/{vector.schema}"}, registry=registry)
        documents = vector.document() if isinstance(vector.document(), list) else [vector.document()]
        for instance in documents:
            assert _errors(component, instance) == _errors(canonical, instance), vector.id
            judged += 1
    assert judged > 100
    # The components carry the canonical content: the same keywords, only `$ref`s and `$defs` moved.
    v1 = document["components"]["schemas"]["deferred-operation-status.v1"]
    canonical_v1 = json.loads(json.dumps(schema_document("deferred-operation-status.v1")))
    assert (
        v1["required"] == canonical_v1["required"]
        and v1["properties"].keys() == canonical_v1["properties"].keys()
    )


def _integers(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every integer schema outside conditionals, with its path."""
    if isinstance(node, list):
        return [found for i, item in enumerate(node) for found in _integers(item, f"{path}/{i}")]
    if not isinstance(node, dict):
        return []
    own = [(path, node)] if node.get("type") == "integer" else []
    inner = [
        found
        for key, value in node.items()
        if key not in ("if", "then", "else", "not")
        for found in _integers(value, f"{path}/{key}")
    ]
    return own + inner


@pytest.mark.asyncio
async def test_every_integer_has_its_bounds_and_free_members_take_strict_json_only(tmp_path: Path) -> None:
    document = await served(tmp_path)
    integers = _integers(document)
    assert len(integers) > 20
    for path, schema in integers:
        assert "minimum" in schema and "maximum" in schema, path
        assert -(2**53 - 1) <= schema["minimum"] <= schema["maximum"] <= 2**53 - 1, path
    registry: Registry[Any] = Registry().with_resource(DOC, DRAFT202012.create_resource(document))
    component = f"{DOC}#/components/schemas/"
    directive = wire_validator({"$ref": component + "sensorium-directive.v1"}, registry=registry)
    base: dict[str, Any] = {"schema": "sensorium-directive.v1", "action_id": "a.b"}
    base["timing"] = {"mode": "async"}
    accepted: dict[str, Any] = {**base, "input": {"a": [5, {"b": -(2**53 - 1)}]}}
    accepted["extensions"] = {"n": {"m": [1, {"x": [2]}]}}
    assert list(directive.iter_errors(accepted)) == []
    refusals: list[dict[str, Any]] = [
        {**base, "input": {"a": 1.5}},
        {**base, "input": {"a": [{"b": 2**53}]}},
        {**base, "input": {}, "causal/context": {"operation/id": "x", "n": {"deep": 0.25}}},
        {**base, "input": {}, "extensions": {"n": -6.6e16}},
    ]
    for refused in refusals:
        assert list(directive.iter_errors(refused)), refused
    result = wire_validator({"$ref": component + "deferred-operation-status.v1"}, registry=registry)
    status: dict[str, Any] = {"schema": "deferred-operation-status.v1", "schema/v": 1, "status": "completed"}
    status["diagnostics"] = []
    status |= {"operation/id": "deferred:sensorium.directive.invoke:" + "A" * 26, "operation/kind": KIND}
    assert list(result.iter_errors({**status, "result": {"json": [1, "x"]}})) == []
    assert list(result.iter_errors({**status, "result": {"json": 0.5}}))


@pytest.mark.asyncio
async def test_the_semantic_refusals_of_admission_are_documented(tmp_path: Path) -> None:
    document = await served(tmp_path)
    for path in ("/v1/directives", "/v1/host/directives"):
        unprocessable = document["paths"][path]["post"]["responses"]["422"]["description"]
        assert "CONTRACT §6.1" in unprocessable and "4096 bytes" in unprocessable
