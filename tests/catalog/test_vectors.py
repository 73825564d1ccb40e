"""The catalog and signature vectors: the JSON Schema and the pydantic models give the same verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ValidationError

from connector.catalog.signing import parse_catalog, parse_signature
from connector.contract.catalog_models import ActionCatalog, CatalogSignature
from connector.errors import CatalogError
from tests.support.paths import REPO, SHIPPED_CATALOG

SCHEMAS = REPO / "schemas"
MODELS: dict[str, type[BaseModel]] = {
    "sensorium-action-catalog.v1": ActionCatalog,
    "sensorium-catalog-signature.v1": CatalogSignature,
}


def validator(name: str) -> jsonschema.Draft202012Validator:
    """A validator of the named schema."""
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    return jsonschema.Draft202012Validator(schema)


def vectors(kind: str) -> list[tuple[str, Path]]:
    """Every vector file of `kind` (valid or invalid) for both schemas, sidecars excluded."""
    return [
        (name, path)
        for name in MODELS
        for path in sorted((SCHEMAS / "vectors" / name / kind).glob("*.json"))
        if not path.name.endswith(".expect.json")
    ]


def load(path: Path) -> Any:
    """A vector document."""
    return json.loads(path.read_text(encoding="utf-8"))


def x_rules(schema: Any) -> dict[int, str]:
    """Subschemas carrying a named rule (`x-rule` on an item, its `then` or `else`), by identity."""
    found: dict[int, str] = {}
    if isinstance(schema, dict):
        rule = schema.get("x-rule")
        for sub in (schema, schema.get("then"), schema.get("else")) if rule else ():
            if isinstance(sub, dict):
                found[id(sub)] = str(rule)
        for value in schema.values():
            found |= x_rules(value)
    elif isinstance(schema, list):
        for value in schema:
            found |= x_rules(value)
    return found


def schema_rules(name: str, document: Any) -> list[str]:
    """The rule of each schema error: its `x-rule` when a named conditional failed, else `schema`."""
    checker = validator(name)
    named = x_rules(checker.schema)
    return [named.get(id(error.schema), "schema") for error in checker.iter_errors(document)]


@pytest.mark.parametrize("name", list(MODELS))
def test_schema_files_follow_the_shared_conventions(name: str) -> None:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://sensorium.invalid/schemas/{name}.schema.json"
    assert schema["properties"]["schema"] == {"const": name}
    assert schema["additionalProperties"] is False
    assert schema["properties"]["extensions"] == {"type": "object"}


@pytest.mark.parametrize("name", list(MODELS))
def test_enough_vectors(name: str) -> None:
    assert len([v for v in vectors("valid") if v[0] == name]) >= 3
    assert len([v for v in vectors("invalid") if v[0] == name]) >= 6


@pytest.mark.parametrize(("name", "path"), vectors("valid"), ids=lambda v: getattr(v, "stem", v))
def test_valid_vectors_pass_both_layers(name: str, path: Path) -> None:
    document = load(path)
    assert list(validator(name).iter_errors(document)) == []
    MODELS[name].model_validate(document)


@pytest.mark.parametrize(("name", "path"), vectors("invalid"), ids=lambda v: getattr(v, "stem", v))
def test_invalid_vectors_fail_at_their_layer_with_their_rule(name: str, path: Path) -> None:
    document = load(path)
    expect = load(path.with_name(f"{path.stem}.expect.json"))
    assert set(expect) == {"rule", "layer"}
    rules = schema_rules(name, document)
    with pytest.raises(ValidationError):
        MODELS[name].model_validate(document)
    if expect["layer"] == "schema":
        assert rules == [expect["rule"]]  # each vector breaks exactly one thing
    else:
        assert expect["layer"] == "semantic" and rules == []
        parse = parse_catalog if name == "sensorium-action-catalog.v1" else parse_signature
        with pytest.raises(CatalogError) as refused:
            parse(document)
        assert expect["rule"] in {d["code"] for d in refused.value.diagnostics}


def test_every_invalid_vector_has_a_sidecar_and_no_sidecar_is_orphaned() -> None:
    for name in MODELS:
        folder = SCHEMAS / "vectors" / name / "invalid"
        documents = {p.stem for p in folder.glob("*.json") if not p.name.endswith(".expect.json")}
        sidecars = {p.name.removesuffix(".expect.json") for p in folder.glob("*.expect.json")}
        assert documents == sidecars


def test_the_example_vectors_are_the_shipped_files() -> None:
    catalog_vector = SCHEMAS / "vectors" / "sensorium-action-catalog.v1" / "valid" / "example-catalog.json"
    signature_vector = (
        SCHEMAS / "vectors" / "sensorium-catalog-signature.v1" / "valid" / "example-catalog-signature.json"
    )
    assert load(catalog_vector) == load(SHIPPED_CATALOG)
    assert load(signature_vector) == load(SHIPPED_CATALOG.with_name("actions.json.sig"))
