"""`sensorium-connector schema validate SCHEMA FILE`: one document, or successive polls of one operation."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from connector.cli.main import EXIT_FAILED, EXIT_OK, usage_error
from connector.contract.schemas import schema_names
from connector.contract.semantic import STATUS_SCHEMAS
from connector.contract.validate import validate


class _NotJson(ValueError):
    """The file holds no single, unambiguous JSON value."""


def register(subparsers: Any) -> None:
    """Add `schema validate`."""
    schema = subparsers.add_parser("schema", help="wire document schemas")
    commands = schema.add_subparsers(dest="schema_command", required=True)
    check = commands.add_parser(
        "validate",
        help="validate a document against a schema and the semantic rules",
        description="FILE holds one document or, for a status schema, a JSON array of successive polls.",
    )
    check.add_argument("schema_name", metavar="SCHEMA", help="e.g. deferred-operation-status.v2")
    check.add_argument("file", metavar="FILE", type=Path, help="the JSON file to judge")
    check.set_defaults(handler=_validate)


def _validate(args: argparse.Namespace) -> int:
    name, path = args.schema_name, args.file
    if name not in schema_names():
        return usage_error("unknown schema; known: " + ", ".join(schema_names()))
    try:
        document = _read_json(path)
    except OSError:
        return usage_error(f"cannot read {path}")
    except _NotJson as reason:
        return usage_error(f"{path} is not valid JSON: {reason}")
    if isinstance(document, list) and name not in STATUS_SCHEMAS:
        return usage_error("a JSON array is only accepted for status schemas")
    if document == []:
        return usage_error("an empty array holds no polls")
    violations = validate(name, document)
    for violation in violations:
        print(violation)
    return EXIT_FAILED if violations else EXIT_OK


def _read_json(path: Path) -> Any:
    """Parse strictly: UTF-8, no NaN or Infinity, no duplicate keys. Reasons never quote the text."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _NotJson("not UTF-8") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as error:
        raise _NotJson(f"syntax error at line {error.lineno}, column {error.colno}") from None
    except RecursionError:
        raise _NotJson("nested too deeply") from None


def _refuse_constant(_: str) -> Any:
    raise _NotJson("NaN and Infinity are not JSON")


def _unique_keys(pairs: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _NotJson("an object repeats a key")
    return document
