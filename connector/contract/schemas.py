"""The canonical JSON Schemas in `schemas/`: loading, `$ref` resolution, and violations named by rule.

A failing part of a schema that sits under an `x-rule` annotation reports that rule's name; every other
failure reports the rule `schema`. Paths are JSON Pointers into the document; no value ever leaves here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator, TypeChecker, ValidationError, validators
from jsonschema.protocols import Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from connector.contract.patterns import ecma
from connector.contract.violations import SCHEMA_RULE, Violation, ordered, pointer
from connector.resources import data_dir

SCHEMA_DIR = data_dir("schemas")
_SUFFIX = ".schema.json"
RULE_KEYWORD = "x-rule"


class UnknownSchemaError(LookupError):
    """A schema name that `schemas/` does not hold."""


@dataclass(frozen=True, slots=True)
class _Loaded:
    documents: Mapping[str, Mapping[str, Any]]
    registry: Registry[Any]
    everything: tuple[Mapping[str, Any], ...]
    by_id: Mapping[str, Mapping[str, Any]]


def schema_names() -> tuple[str, ...]:
    """The names of every schema in `schemas/` (the file name without `.schema.json`)."""
    return tuple(sorted(_loaded().documents))


def schema_document(name: str) -> Mapping[str, Any]:
    """The parsed schema called `name`."""
    try:
        return _loaded().documents[name]
    except KeyError:
        raise UnknownSchemaError("no schema by that name") from None


def schema_files() -> Mapping[str, Mapping[str, Any]]:
    """Every file of `schemas/` by file name (documents and shared definitions), parsed."""
    return {path.rsplit("/", 1)[-1]: contents for path, contents in _loaded().by_id.items()}


@functools.cache
def schema_rules() -> frozenset[str]:
    """Every rule name the schemas carry in an `x-rule` annotation."""
    return frozenset(_rules_in(list(_loaded().everything)))


def schema_violations(name: str, document: Any) -> list[Violation]:
    """Where `document` breaks schema `name`, and which rule each failure belongs to."""
    root = schema_document(name)
    errors = _validator(name).iter_errors(document)
    return ordered(v for error in errors for v in _violations(error, root))


@functools.cache
def _loaded() -> _Loaded:
    documents: dict[str, Mapping[str, Any]] = {}
    by_id: dict[str, Mapping[str, Any]] = {}
    for path in sorted(SCHEMA_DIR.glob("*.json")):
        contents = json.loads(path.read_text(encoding="utf-8"))
        by_id[contents["$id"]] = contents
        if path.name.endswith(_SUFFIX):
            documents[path.name.removesuffix(_SUFFIX)] = contents
    resources = [(uri, DRAFT202012.create_resource(_without_dialect(c))) for uri, c in by_id.items()]
    return _Loaded(documents, Registry().with_resources(resources), tuple(by_id.values()), by_id)


def _without_dialect(contents: Mapping[str, Any]) -> Mapping[str, Any]:
    # jsonschema picks the stock validator for a $ref target that names its $schema (Validator.evolve ->
    # validator_for), dropping the wire rules below; the registry resources are 2020-12 by construction.
    return {key: value for key, value in contents.items() if key != "$schema"}


def _is_integer(checker: TypeChecker, instance: object) -> bool:
    # The wire carries no floats (CONTRACT §1): 1.0 is not an integer here, as in the strict models.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _ecma_pattern(
    validator: Validator, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if isinstance(instance, str) and not ecma(pattern).search(instance):
        yield ValidationError("does not match its pattern")


_WireValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    validators={"pattern": _ecma_pattern},
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer),
)


def wire_validator(schema: Mapping[str, Any], registry: Registry[Any] | None = None) -> Validator:
    """A 2020-12 validator with the wire rules (no float integers, ECMA-262 patterns) for any schema."""
    return _WireValidator(schema, registry=registry if registry is not None else _loaded().registry)


@functools.cache
def _validator(name: str) -> Validator:
    return _WireValidator(schema_document(name), registry=_loaded().registry)


def _violations(error: ValidationError, root: Mapping[str, Any]) -> Iterator[Violation]:
    at, rule, keyword = list(error.absolute_path), _rule_of(error, root), _keyword(error)
    required = error.validator_value if error.validator == "required" else None
    if isinstance(required, list) and isinstance(error.instance, Mapping):
        # Point at each missing member, as a model does; the names come from the schema, not the document.
        for key in required:
            if key not in error.instance:
                yield Violation(pointer(*at, key), rule, keyword)
    else:
        # For a closed object this names the object: an unknown key is the sender's text, not ours to echo.
        yield Violation(pointer(*at), rule, keyword)


def _keyword(error: ValidationError) -> str:
    """The failing keyword (`false` schemas fail as the keyword that holds them, e.g. a forbidden member)."""
    keyword = error.validator
    if isinstance(keyword, str) and keyword:
        return keyword
    steps = [step for step in error.schema_path if isinstance(step, str)]
    return steps[-1] if steps else "false"


def _rule_of(error: ValidationError, root: Mapping[str, Any]) -> str:
    """The innermost `x-rule` on the way from the root schema to the failing keyword."""
    node: Any = root
    resolver = _loaded().registry.resolver(base_uri=root["$id"])
    rule = SCHEMA_RULE
    for step in error.absolute_schema_path:
        # jsonschema leaves `$ref` out of schema paths: follow it whenever the step is not here.
        while isinstance(node, Mapping) and step not in node and "$ref" in node:
            resolved = resolver.lookup(node["$ref"])
            node, resolver = resolved.contents, resolved.resolver
            rule = _rule_in(node, rule)
        if not _has_step(node, step):
            return rule  # a keyword that leaves no step of its own: the rule so far stands
        node = node[step]
        rule = _rule_in(node, rule)
    return rule


def _has_step(node: Any, step: str | int) -> bool:
    if isinstance(node, Mapping):
        return step in node
    return isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node)


def _rules_in(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        if RULE_KEYWORD in node:
            yield str(node[RULE_KEYWORD])
        node = list(node.values())
    if isinstance(node, list):
        for item in node:
            yield from _rules_in(item)


def _rule_in(node: Any, current: str) -> str:
    return str(node[RULE_KEYWORD]) if isinstance(node, Mapping) and RULE_KEYWORD in node else current
