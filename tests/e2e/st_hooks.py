"""Schemathesis hooks (loaded through SCHEMATHESIS_HOOKS by the fuzz test): the sensorium-error check.

No body is filtered or rewritten: the document states the number rule of CONTRACT §1 (bounded integers,
strict JSON values in free-form members), so every body schemathesis generates as valid is one the server
must take, and `positive_data_acceptance` (in `--checks all`) holds it to that."""

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
