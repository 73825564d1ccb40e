"""One entry for checking wire documents: shapes (schema or model) plus the semantic rules of CONTRACT §1."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from connector.contract.models import MODELS, validate_wire
from connector.contract.schemas import UnknownSchemaError, schema_names, schema_rules, schema_violations
from connector.contract.semantic import (
    SEMANTIC_RULES,
    STATUS_SCHEMAS,
    document_violations,
    sequence_violations,
)
from connector.contract.violations import SCHEMA_RULE, Violation, merge, ordered, pointer

Via = Literal["schema", "model"]


def validate(name: str, document: Any, *, via: Via = "schema") -> list[Violation]:
    """Every violation of `document` (or, for a status schema, of a list of successive polls)."""
    _require_known(name, via)
    if not isinstance(document, list):
        return merge(_shape(name, document, via), document_violations(name, document))
    if name not in STATUS_SCHEMAS:
        raise ValueError("a list of polls is only defined for status schemas")
    shapes = [v.under(pointer(i)) for i, doc in enumerate(document) for v in _shape(name, doc, via)]
    return merge(shapes, sequence_violations(name, document))


def model_violations(name: str, document: Any) -> list[Violation]:
    """Where `document` breaks the model of `name`; pydantic's messages and inputs are never used."""
    try:
        validate_wire(name, document)
    except ValidationError as error:
        details = error.errors(include_url=False, include_context=False, include_input=False)
        return ordered(_from_pydantic(detail) for detail in details)
    return []


def _require_known(name: str, via: Via) -> None:
    known = schema_names() if via == "schema" else tuple(MODELS)
    if name not in known:
        raise UnknownSchemaError("no schema by that name")


def _shape(name: str, document: Any, via: Via) -> list[Violation]:
    return schema_violations(name, document) if via == "schema" else model_violations(name, document)


def _from_pydantic(detail: ErrorDetails) -> Violation:
    loc = list(detail["loc"])
    if detail["type"] == "extra_forbidden":
        loc = loc[:-1]  # the unknown key is the sender's text: name the object, as the schema path does
    return Violation(pointer(*loc), _rule_named(detail), _PYDANTIC_KEYWORDS.get(detail["type"], "type"))


# pydantic error types as the JSON Schema keywords they stand for (the rest are type mismatches).
_PYDANTIC_KEYWORDS = {
    "missing": "required",
    "extra_forbidden": "additionalProperties",
    "literal_error": "enum",
    "enum": "enum",
    "string_too_long": "maxLength",
    "string_too_short": "minLength",
    "too_long": "maxItems",
    "too_short": "minItems",
    "greater_than_equal": "minimum",
    "greater_than": "exclusiveMinimum",
    "less_than_equal": "maximum",
    "less_than": "exclusiveMaximum",
    "string_pattern_mismatch": "pattern",
    "value_error": "",
    "assertion_error": "",
}


def _rule_named(detail: ErrorDetails) -> str:
    """A model's own check of a named rule raises `<rule>: ...`; only known rule names pass through."""
    if detail["type"] != "value_error":
        return SCHEMA_RULE
    head = detail["msg"].removeprefix("Value error, ").split(":", 1)[0]
    return head if head in SEMANTIC_RULES | schema_rules() else SCHEMA_RULE
