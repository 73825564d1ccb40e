"""Pure admission steps 3, 4, 7 and 8: each refusal has its SPEC 14 code and a generic message."""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.contract.canonical import canonical_bytes
from connector.core.admission import (
    check_execution_mode,
    check_idempotent_replay,
    directive_fingerprint,
    find_action,
    require_status_v2,
)
from connector.errors import AdmissionError

SECRET_ACTION = "vendor.secret-action-7f3a"

DIRECTIVE: dict[str, Any] = {
    "schema": "sensorium-directive.v1",
    "action_id": "device.discovery.scan",
    "timing": {"mode": "async", "status_versions": [1, 2], "timeout_ms": 90000},
    "input": {"transport": "ble", "window_seconds": 10, "filters": {"name_prefix": "Canary-77"}},
    "idempotency_key": "key-1",
    "correlation/id": "corr-1",
    "causal/context": {"operation/id": "op-parent"},
    "extensions": {"x": 1},
}


def _refusal(excinfo: pytest.ExceptionInfo[AdmissionError], code: str, status: int) -> AdmissionError:
    error = excinfo.value
    assert (error.code, error.http_status) == (code, status)
    assert error.to_document()["code"] == code
    return error


def test_find_action() -> None:
    actions = {"device.discovery.scan": "scan-entry", "other": "other-entry"}
    assert find_action(actions, "other") == "other-entry"


def test_find_action_keeps_falsy_entries() -> None:
    assert find_action({"a": 0}, "a") == 0


@pytest.mark.parametrize("action_id", [SECRET_ACTION, "", "DEVICE.DISCOVERY.SCAN"])
def test_unknown_action(action_id: str) -> None:
    with pytest.raises(AdmissionError) as info:
        find_action({"device.discovery.scan": 1}, action_id)
    error = _refusal(info, "unknown-action", 404)
    if action_id:
        assert action_id not in error.message
        assert action_id not in str(error.to_document())


MODE_TABLE = [
    (None, "sync", True),
    (None, "async", False),
    ("sync-only", "sync", True),
    ("sync-only", "async", False),
    ("async-only", "sync", False),
    ("async-only", "async", True),
    ("either", "sync", True),
    ("either", "async", True),
]


@pytest.mark.parametrize(("support", "mode", "allowed"), MODE_TABLE)
def test_execution_mode(support: str | None, mode: str, allowed: bool) -> None:
    if allowed:
        check_execution_mode(support, mode)
        return
    with pytest.raises(AdmissionError) as info:
        check_execution_mode(support, mode)
    _refusal(info, "execution-mode-not-supported", 409)


@pytest.mark.parametrize("mode", ["", "ASYNC", "deferred", "Canary-77"])
def test_unknown_requested_mode_is_an_invalid_directive(mode: str) -> None:
    with pytest.raises(AdmissionError) as info:
        check_execution_mode("either", mode)
    error = _refusal(info, "invalid-directive", 422)
    assert error.diagnostics == ({"code": "enum", "message": "/timing/mode"},)
    if mode:
        assert mode not in str(error.to_document())


def test_unknown_catalog_support_is_our_bug() -> None:
    with pytest.raises(ValueError):
        check_execution_mode("sometimes", "sync")


@pytest.mark.parametrize("versions", [[2], [1, 2], [2, 1], (2,)])
def test_status_v2_present(versions: list[int]) -> None:
    require_status_v2(versions)


@pytest.mark.parametrize("versions", [None, [1], [], [True], [3]])
def test_status_v2_required(versions: list[int] | None) -> None:
    with pytest.raises(AdmissionError) as info:
        require_status_v2(versions)
    error = _refusal(info, "status-v2-required", 409)
    assert error.diagnostics == ({"code": "status-v2-required", "message": "/timing/status_versions"},)


def test_fingerprint_covers_action_timing_and_input() -> None:
    expected = hashlib.sha256(
        canonical_bytes({k: DIRECTIVE[k] for k in ("action_id", "timing", "input")})
    ).digest()
    assert directive_fingerprint(DIRECTIVE) == expected
    assert len(expected) == 32


@pytest.mark.parametrize(
    "field", ["schema", "idempotency_key", "correlation/id", "causal/context", "extensions"]
)
def test_fingerprint_ignores_other_fields(field: str) -> None:
    changed = copy.deepcopy(DIRECTIVE)
    changed[field] = {"different": True}
    assert directive_fingerprint(changed) == directive_fingerprint(DIRECTIVE)
    del changed[field]
    assert directive_fingerprint(changed) == directive_fingerprint(DIRECTIVE)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("action_id",), "device.discovery.other"),
        (("timing", "mode"), "sync"),
        (("timing", "timeout_ms"), 90001),
        (("timing", "status_versions"), [2]),
        (("input", "window_seconds"), 11),
        (("input", "filters", "name_prefix"), "Canary-78"),
    ],
)
def test_fingerprint_changes_with_covered_fields(path: tuple[str, ...], value: object) -> None:
    changed = copy.deepcopy(DIRECTIVE)
    target = changed
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert directive_fingerprint(changed) != directive_fingerprint(DIRECTIVE)


def test_fingerprint_ignores_key_order_but_not_absence() -> None:
    reordered = dict(reversed(list(DIRECTIVE.items())))
    reordered["timing"] = dict(reversed(list(DIRECTIVE["timing"].items())))
    assert directive_fingerprint(reordered) == directive_fingerprint(DIRECTIVE)
    absent = {k: v for k, v in DIRECTIVE.items() if k != "input"}
    null = {**absent, "input": None}
    assert directive_fingerprint(absent) != directive_fingerprint(null)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=12,
)


@given(json_values, json_values, json_values)
def test_replay_with_same_fingerprint_passes_and_others_conflict(
    timing: Any, first: Any, second: Any
) -> None:
    one = directive_fingerprint({"action_id": "a", "timing": timing, "input": first})
    two = directive_fingerprint({"action_id": "a", "timing": timing, "input": second})
    check_idempotent_replay(one, one)
    if canonical_bytes(first) == canonical_bytes(second):
        check_idempotent_replay(one, two)
        return
    with pytest.raises(AdmissionError) as info:
        check_idempotent_replay(one, two)
    _refusal(info, "idempotency-conflict", 409)


@pytest.mark.parametrize(
    ("directive", "path"),
    [
        ({"action_id": "a", "timing": {"mode": "sync"}, "input": {"n": 2**60}}, "/input"),
        ({"action_id": "a", "timing": {"mode": "sync", "timeout_ms": -(2**54)}, "input": {}}, "/timing"),
        ({"action_id": "a", "timing": {"mode": "sync"}, "input": {"x": float("nan")}}, "/input"),
        ({"action_id": "a", "timing": {"mode": "sync"}, "input": {1: "non-string key"}}, "/input"),
    ],
)
def test_fingerprint_refuses_values_rfc8785_cannot_encode(directive: dict[str, Any], path: str) -> None:
    with pytest.raises(AdmissionError) as info:
        directive_fingerprint(directive)
    error = _refusal(info, "invalid-directive", 422)
    assert error.diagnostics == ({"code": "not-canonicalizable", "message": path},)
    assert error.__cause__ is None
    assert error.__suppress_context__
    for leaked in (str(2**60), str(2**54), "nan", "non-string key"):
        assert leaked not in str(error.to_document())


def test_idempotency_conflict_message_is_generic() -> None:
    changed = copy.deepcopy(DIRECTIVE)
    changed["input"]["filters"]["name_prefix"] = "Canary-99"
    with pytest.raises(AdmissionError) as info:
        check_idempotent_replay(directive_fingerprint(DIRECTIVE), directive_fingerprint(changed))
    document = str(_refusal(info, "idempotency-conflict", 409).to_document())
    assert "Canary" not in document
    assert directive_fingerprint(changed).hex() not in document
