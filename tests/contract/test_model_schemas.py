"""Every pydantic model states the same shape as its schema in `schemas/`: nothing is kept by hand twice.

Both sides are reduced to one comparable shape (the JSON Schema pydantic emits for a model, and the schema
file with its `$ref`s resolved): member names, the required set, open or closed objects, consts and enums,
types, bounds and patterns. Conditionals (`allOf`/`if`/`then`, `not`) are the semantic rules of
`connector.contract.semantic`, checked by the vectors through both paths; `uniqueItems` is a model
validator (`_unique`), which pydantic does not spell in its JSON Schema. `KNOWN_LOOSER` lists, by name, the
one place where a model accepts more than its schema.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
from pydantic import BaseModel

from connector.contract.models import MODELS, ErrorDocument, Text
from connector.contract.schemas import schema_document, schema_files, schema_names

# Keywords that describe a shape; everything else (titles, descriptions, defaults, rules) is not compared.
BOUNDS = ("minLength", "maxLength", "pattern", "minimum", "maximum", "minItems", "maxItems")
NOT_COMPARED = {"uniqueItems"}
# Where a model is knowingly looser than its schema (kept as it is: tightening it would refuse a catalog that
# `serve` accepts today). The catalog's times are bounded by their pattern only, not by the 256 characters.
KNOWN_LOOSER = {
    "sensorium-action-catalog.v1": [
        "/properties/expires_at/maxLength: only the schema has it",
        "/properties/issued_at/maxLength: only the schema has it",
    ]
}


def _local(document: Mapping[str, Any], pointer: str) -> Any:
    node: Any = document
    for part in filter(None, pointer.split("/")):
        node = node[part]
    return node


def _shape(node: Any, document: Mapping[str, Any], resolve: Any) -> Any:
    """The comparable shape of one (sub)schema; `resolve(ref, document)` follows a `$ref`."""
    if isinstance(node, bool):
        return {} if node else False  # `true` accepts anything, as an empty schema does
    if "$ref" in node:
        target, home = resolve(node["$ref"], document)
        return _shape(target, home, resolve)
    branches = [b for b in node.get("anyOf", ()) if b != {"type": "null"}]
    if branches:
        # pydantic spells `X | None` (an optional member, absent rather than null on the wire) as anyOf.
        assert len(branches) == 1, node
        return _shape(branches[0], document, resolve)
    if "const" in node or "enum" in node:
        values = [node["const"]] if "const" in node else node["enum"]
        return {"enum": sorted(values, key=repr)}
    shape: dict[str, Any] = {key: node[key] for key in BOUNDS if key in node}
    kind = node.get("type")
    if kind is not None:
        shape["type"] = kind
    if kind == "array":
        shape["items"] = _shape(node.get("items", {}), document, resolve)
    if kind == "object":
        properties = node.get("properties", {})
        shape["properties"] = {k: _shape(v, document, resolve) for k, v in properties.items()}
        shape["required"] = sorted(node.get("required", ()))
        shape["closed"] = node.get("additionalProperties") is False
    return shape


def _file_shape(name: str) -> Any:
    files = schema_files()

    def resolve(ref: str, document: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any]]:
        file_name, _, pointer = ref.partition("#")
        home = files[file_name] if file_name else document
        return _local(home, pointer), home

    return _shape(schema_document(name), schema_document(name), resolve)


def _model_shape(model: type[BaseModel]) -> Any:
    emitted = model.model_json_schema(by_alias=True, mode="validation")

    def resolve(ref: str, document: Mapping[str, Any]) -> tuple[Any, Mapping[str, Any]]:
        assert ref.startswith("#/"), ref
        return _local(emitted, ref[1:]), emitted

    return _shape(emitted, emitted, resolve)


def _differences(model: Any, schema: Any, at: str = "") -> list[str]:
    """Where the two shapes part, as readable lines (empty when they agree)."""
    if isinstance(model, dict) and isinstance(schema, dict):
        found = []
        for key in sorted(set(model) | set(schema)):
            if key not in model or key not in schema:
                side = "model" if key in model else "schema"
                found.append(f"{at}/{key}: only the {side} has it")
            else:
                found += _differences(model[key], schema[key], f"{at}/{key}")
        return found
    return [] if model == schema else [f"{at}: model {model!r} != schema {schema!r}"]


@pytest.mark.parametrize("name", schema_names())
def test_the_model_states_the_shape_of_its_schema(name: str) -> None:
    assert _differences(_model_shape(MODELS[name]), _file_shape(name)) == KNOWN_LOOSER.get(name, [])


def test_the_comparison_sees_a_drifted_model() -> None:
    class Drifted(ErrorDocument):
        message: Text | None = None  # type: ignore[assignment]  # optional here, required by the schema

    found = _differences(_model_shape(Drifted), _file_shape("sensorium-error.v1"))
    assert len(found) == 1 and found[0].startswith("/required: model ['code', 'schema'] != schema")


def test_no_keyword_escapes_the_comparison_unnoticed() -> None:
    """Every keyword the schema files use is either compared or named here as deliberately not compared."""
    compared = {*BOUNDS, "$ref", "anyOf", "const", "enum", "type", "items", "properties", "required"}
    compared |= {"additionalProperties"}
    annotations = {"$schema", "$id", "$defs", "title", "description", "default"}
    semantic = {"allOf", "oneOf", "if", "then", "not", "x-rule"}  # the rules of contract/semantic.py
    known = compared | annotations | semantic | NOT_COMPARED
    used: set[str] = set()

    def walk(node: Any, under_properties: bool = False) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if not under_properties:
                    used.add(key)
                walk(value, key in ("properties", "$defs") and not under_properties)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for document in schema_files().values():
        walk(document)
    assert used - known == set()
