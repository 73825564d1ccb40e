"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS by the fuzz test): the sensorium-error check."""

from __future__ import annotations

import json
from typing import Any

import schemathesis

from connector.contract.validate import validate
from connector.errors import HTTP_STATUS_BY_CODE


@schemathesis.check
def sensorium_error_body(ctx: Any, response: Any, case: Any) -> None:
    """Every non-2xx answer is a valid `sensorium-error.v1` whose code belongs to its HTTP status."""
    if response.status_code < 300:
        return
    body = json.loads(response.content)
    violations = validate("sensorium-error.v1", body)
    if violations:
        raise AssertionError(f"not a sensorium-error.v1: {[str(v) for v in violations]}")
    if HTTP_STATUS_BY_CODE.get(body["code"]) != response.status_code:
        raise AssertionError(f"code {body['code']} does not belong to HTTP {response.status_code}")


def _wire_value(value: Any) -> tuple[bool, Any]:
    """(keep, value): the wire form of a generated value, or keep=False when SPEC 1 refuses it outright.

    JSON Schema counts 1.0 as the integer 1 (the same value in its data model), while the wire refuses a
    number spelt as a float (SPEC 1): such a number is sent in its integer spelling. A non-integral number,
    or an integer beyond +-(2^53 - 1), anywhere in a body - open objects included - is refused by SPEC 1
    and stated so in the document's description; no JSON Schema can say it about an open object.
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True, value
    if isinstance(value, float):
        return (value.is_integer() and abs(value) <= _MAX_SAFE), int(value) if value.is_integer() else value
    if isinstance(value, int):
        return abs(value) <= _MAX_SAFE, value
    items = value.items() if isinstance(value, dict) else enumerate(value)
    mapped: dict[Any, Any] = {}
    for key, item in items:
        keep, mapped[key] = _wire_value(item)
        if not keep:
            return False, value
    return True, mapped if isinstance(value, dict) else list(mapped.values())


_MAX_SAFE = 2**53 - 1


@schemathesis.hook
def filter_body(ctx: Any, body: Any) -> bool:
    """Skip bodies SPEC 1 refuses whatever the schema says (see `_wire_value`)."""
    return _wire_value(body)[0]


@schemathesis.hook
def map_body(ctx: Any, body: Any) -> Any:
    """Integral floats in their integer spelling (the same JSON Schema value)."""
    return _wire_value(body)[1]
