"""Pure admission: the steps one by one, then `plan_admission` as a table (CONTRACT §2 order, ids, clamps)."""

from __future__ import annotations

import copy
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.catalog.signing import VerifiedCatalog
from connector.contract.canonical import canonical_bytes
from connector.contract.catalog_models import CatalogAction
from connector.core.admission import (
    Admitted,
    AdmittedCommand,
    AdmittedScan,
    check_execution_mode,
    check_idempotent_replay,
    directive_fingerprint,
    find_action,
    plan_admission,
    require_status_v2,
)
from connector.core.authority import Grant, Principal
from connector.core.clock import format_time, to_ms
from connector.core.commands import CommandAction
from connector.core.ids import OPERATION_KIND, keyed_operation_id, random_operation_id
from connector.core.policy import DeferredHostPolicy
from connector.core.projections import deferred_handle
from connector.errors import AdmissionError, SensoriumError

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


# ---- plan_admission: CONTRACT §2 steps 2-8 as one pure plan
# -----------------------------------------------------

NOW = datetime(2026, 3, 1, 12, 0, 0, 500, tzinfo=UTC)  # 0.5 ms past the second: roundings show
SCAN = "device.discovery.scan"
REDACT = "whisper.redaction.prepare"
INFO = "sensorium.os.info"
PROFILE_JSON: dict[str, Any] = {
    "transports": ["ble", "usb-serial", "mdns"],
    "max_window_seconds": 60,
    "max_candidates": 64,
    "max_snapshot_bytes": 65536,
    "min_revision_interval_ms": 250,
    "max_revisions": 1000,
    "candidate_ttl_seconds": 30,
    "cleanup_timeout_ms": 4000,
    "allow_unfiltered": False,
    "result_retention_seconds": 600,
}
ACTIONS_JSON: list[dict[str, Any]] = [
    {
        "action_id": SCAN,
        "class": "discovery",
        "execution_mode_support": "async-only",
        "deferred_profile": {"preferred_max_ttl_seconds": 300, "retry_after_seconds": 2},
        "discovery": PROFILE_JSON,
    },
    {
        "action_id": REDACT,
        "class": "command",
        "execution_mode_support": "either",
        "deferred_profile": {"preferred_max_ttl_seconds": 120, "retry_after_seconds": 3},
        "command": {"argv": ["x"], "timeout_ms": 10000, "cancel": "terminate", "input": "stdin-json"},
    },
    {
        "action_id": INFO,
        "class": "command",
        "execution_mode_support": "sync-only",
        "command": {"argv": ["uname"], "timeout_ms": 2000, "cancel": "none", "input": "none"},
    },
]
CATALOG = VerifiedCatalog(
    catalog_id="test",
    version=1,
    issued_at=NOW,
    expires_at=None,
    actions={a["action_id"]: CatalogAction.model_validate(a) for a in ACTIONS_JSON},
    key_id="0" * 16,
)
ALICE = Principal(
    "alice", "caller", "a" * 64, grants=(Grant(SCAN, ("ble", "mdns")), Grant(REDACT), Grant(INFO))
)
BOB = Principal("bob", "caller", "b" * 64, grants=(Grant(SCAN, ("ble", "mdns")),))
OPERATOR = Principal("ops", "operator", "c" * 64)
SCAN_DIRECTIVE: dict[str, Any] = {
    "schema": "sensorium-directive.v1",
    "action_id": SCAN,
    "timing": {"mode": "async", "status_versions": [2]},
    "input": {"transport": "ble", "window_seconds": 10, "filters": {"name_prefix": "Canary-77"}},
    "idempotency_key": "key-1",
    "causal/context": {"operation/id": "op-parent"},
}
COMMAND_DIRECTIVE: dict[str, Any] = {
    "schema": "sensorium-directive.v1",
    "action_id": REDACT,
    "timing": {"mode": "async"},
    "input": {"text": "Canary-77"},
}


class _Entropy:
    """Counts draws: an unkeyed directive draws 16 bytes once, a keyed one never."""

    def __init__(self) -> None:
        self.draws: list[int] = []

    def __call__(self, size: int) -> bytes:
        self.draws.append(size)
        return bytes(range(size))


def _plan(
    directive: Any,
    principal: Principal = ALICE,
    *,
    entropy: _Entropy | None = None,
    op_key: str | None = None,
    check_grant: bool = True,
) -> Admitted:
    return plan_admission(
        directive,
        principal=principal,
        catalog=CATALOG,
        policy=DeferredHostPolicy(),
        now=NOW,
        entropy=entropy or _Entropy(),
        op_key=op_key,
        check_grant=check_grant,
    )


def _changed(base: dict[str, Any], *edits: tuple[tuple[str, ...], Any]) -> dict[str, Any]:
    """A deep copy with each (path, value) set; the value `DELETE` removes the key."""
    changed = copy.deepcopy(base)
    for path, value in edits:
        target = changed
        for key in path[:-1]:
            target = target[key]
        if value is DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return changed


DELETE = object()
BAD_SCHEMA = (("schema",), "sensorium-directive.v2")
UNKNOWN_ACTION = (("action_id",), SECRET_ACTION)
SYNC_MODE = (("timing", "mode"), "sync")
UNGRANTED_TRANSPORT = (("input", "transport"), "usb-serial")
BAD_WINDOW = (("input", "window_seconds"), 0)
NO_V2 = (("timing", "status_versions"), [1])
OUT_OF_RANGE = (("timing", "timeout_ms"), 2**60)  # the schema bounds integers to the JSON-safe range

REFUSALS = [
    ([BAD_SCHEMA], "invalid-directive"),
    ([(("timing",), DELETE)], "invalid-directive"),
    ([(("timing", "mode"), "later")], "invalid-directive"),
    ([UNKNOWN_ACTION], "unknown-action"),
    ([SYNC_MODE], "execution-mode-not-supported"),
    ([UNGRANTED_TRANSPORT], "forbidden"),
    ([BAD_WINDOW], "invalid-input"),
    ([(("input", "filters"), DELETE)], "invalid-input"),
    ([(("timing", "timeout_ms"), 5000)], "invalid-input"),  # a window longer than the timeout
    ([NO_V2], "status-v2-required"),
    ([(("timing", "status_versions"), DELETE)], "status-v2-required"),
    ([OUT_OF_RANGE], "invalid-directive"),
    # The order of CONTRACT §2: with several faults, the earliest step refuses.
    ([UNKNOWN_ACTION, BAD_SCHEMA], "invalid-directive"),
    ([SYNC_MODE, UNKNOWN_ACTION], "unknown-action"),
    ([UNGRANTED_TRANSPORT, SYNC_MODE], "execution-mode-not-supported"),
    ([BAD_WINDOW, UNGRANTED_TRANSPORT], "forbidden"),
    ([NO_V2, BAD_WINDOW], "invalid-input"),
    ([OUT_OF_RANGE, UNKNOWN_ACTION], "invalid-directive"),
]


@pytest.mark.parametrize(("edits", "code"), REFUSALS)
def test_a_scan_is_refused_at_the_first_failing_step(
    edits: list[tuple[tuple[str, ...], Any]], code: str
) -> None:
    entropy = _Entropy()
    with pytest.raises(SensoriumError) as info:
        _plan(_changed(SCAN_DIRECTIVE, *edits), entropy=entropy)
    assert info.value.code == code
    assert "Canary" not in str(info.value.to_document())
    assert SECRET_ACTION not in str(info.value.to_document())
    assert entropy.draws == []  # keyed: the id needs no entropy, refused or not


@pytest.mark.parametrize("directive", [[], "directive", None, 7])
def test_what_is_not_an_object_is_not_a_directive(directive: Any) -> None:
    with pytest.raises(AdmissionError) as info:
        _plan(directive)
    assert _refusal(info, "invalid-directive", 422).diagnostics == (
        {"code": "invalid-directive", "message": "/: type"},
    )


COMMAND_REFUSALS = [
    ([(("timing", "mode"), "deferred")], ALICE, "invalid-directive"),
    ([(("action_id",), INFO), (("timing", "mode"), "async")], ALICE, "execution-mode-not-supported"),
    ([], BOB, "forbidden"),
    ([], OPERATOR, "forbidden"),  # operators hold no caller grants
    ([(("action_id",), INFO), (("timing", "mode"), "sync")], ALICE, "invalid-input"),  # `input: none`
    ([(("input", "text"), 2**60)], ALICE, "invalid-input"),  # stdin JSON first: step 6 before step 8
    ([(("input", "text"), 2**60), (("timing", "mode"), "later")], ALICE, "invalid-directive"),
]


@pytest.mark.parametrize(("edits", "principal", "code"), COMMAND_REFUSALS)
def test_a_command_is_refused_at_the_first_failing_step(
    edits: list[tuple[tuple[str, ...], Any]], principal: Principal, code: str
) -> None:
    with pytest.raises(SensoriumError) as info:
        _plan(_changed(COMMAND_DIRECTIVE, *edits), principal)
    assert info.value.code == code


def test_a_keyed_scan_has_the_derived_id_and_draws_no_entropy() -> None:
    entropy = _Entropy()
    admitted = _plan(SCAN_DIRECTIVE, entropy=entropy)
    assert isinstance(admitted, AdmittedScan) and admitted.keyed
    assert admitted.operation_id == keyed_operation_id("alice", SCAN, "key-1")
    assert entropy.draws == []
    assert admitted.fingerprint == directive_fingerprint(SCAN_DIRECTIVE)


def test_the_bus_op_overrides_the_directive_key() -> None:
    admitted = _plan(SCAN_DIRECTIVE, op_key="bus-op-1")
    assert admitted.operation_id == keyed_operation_id("alice", SCAN, "bus-op-1")
    unkeyed = _changed(SCAN_DIRECTIVE, (("idempotency_key",), DELETE))
    assert _plan(unkeyed, op_key="bus-op-1").operation_id == admitted.operation_id


def test_the_keyed_id_depends_on_principal_action_and_key_only() -> None:
    first = _plan(SCAN_DIRECTIVE)
    other_input = _plan(_changed(SCAN_DIRECTIVE, (("input", "window_seconds"), 20)))
    assert other_input.operation_id == first.operation_id
    assert other_input.fingerprint != first.fingerprint
    assert _plan(SCAN_DIRECTIVE, BOB).operation_id != first.operation_id
    keyed_command = _plan({**COMMAND_DIRECTIVE, "idempotency_key": "key-1"})
    assert keyed_command.operation_id == keyed_operation_id("alice", REDACT, "key-1")


def test_an_unkeyed_directive_draws_128_bits_once() -> None:
    entropy = _Entropy()
    admitted = _plan(COMMAND_DIRECTIVE, entropy=entropy)
    assert isinstance(admitted, AdmittedCommand) and not admitted.keyed
    assert entropy.draws == [16]
    assert admitted.operation_id == random_operation_id(OPERATION_KIND, bytes(range(16)))


def test_an_admitted_scan_carries_its_session_and_handle() -> None:
    admitted = _plan(SCAN_DIRECTIVE)
    assert isinstance(admitted, AdmittedScan)
    spec = admitted.session
    now_ms = to_ms(NOW)
    assert (spec.owner, spec.action_id, spec.scope.transport, spec.scope.window_seconds) == (
        "alice",
        SCAN,
        "ble",
        10,
    )
    assert spec.profile == CATALOG.discovery_profile(SCAN)
    assert (spec.created_at_ms, spec.window_end_ms, spec.cut_by_deadline) == (now_ms, now_ms + 10_000, False)
    assert spec.timeout_at_ms is None
    assert spec.expires_at_ms == now_ms + 300_000  # the action's preferred TTL
    assert spec.retry_after_seconds == 2
    assert spec.causal_context == {"operation/id": "op-parent"}
    assert spec.adapter is None  # resolved by the runtime when it takes the claim
    op_id = admitted.operation_id
    assert admitted.handle == {
        "schema": "sensorium-connector-deferred.v1",
        "connector_operation/id": op_id,
        "action_id": SCAN,
        "retry_after_seconds": 2,
        "status_path": f"/v1/operations/{op_id}",
        # 299.9995 s from `now` to the millisecond-floored expiry: a scan's hint rounds down.
        "fail_after_seconds": 299,
        "cancel_path": f"/v1/operations/{op_id}/cancel",
        "diagnostics": [],
    }


START = NOW.replace(microsecond=0)
DEADLINES = [
    # (deadline, timeout_ms) -> (window end, cut by the deadline, expiry), all in ms after START
    (None, None, 10_000, False, 300_000),
    (3_600_000, None, 10_000, False, 300_000),
    (20_000, None, 10_000, False, 20_000),  # the cut (15 s) falls after the window's own end
    (12_000, None, 7_000, True, 12_000),  # the deadline less cleanup (4 s) and proof (1 s) budgets
    (3_000, None, 0, True, 3_000),  # cut before the start: the window ends at once
    (-5_000, None, 0, True, 0),
    (None, 15_000, 10_000, False, 300_000),
]


@pytest.mark.parametrize(("deadline_ms", "timeout_ms", "window_end", "cut", "expiry"), DEADLINES)
def test_the_deadline_clamps_the_window_and_the_expiry(
    deadline_ms: int | None, timeout_ms: int | None, window_end: int, cut: bool, expiry: int
) -> None:
    edits: list[tuple[tuple[str, ...], Any]] = []
    if deadline_ms is not None:
        edits.append((("timing", "deadline_at"), format_time(START + timedelta(milliseconds=deadline_ms))))
    if timeout_ms is not None:
        edits.append((("timing", "timeout_ms"), timeout_ms))
    admitted = _plan(_changed(SCAN_DIRECTIVE, *edits))
    assert isinstance(admitted, AdmittedScan)
    spec, start_ms = admitted.session, to_ms(START)
    assert (spec.window_end_ms - start_ms, spec.cut_by_deadline) == (window_end, cut)
    assert spec.expires_at_ms is not None and spec.expires_at_ms - start_ms == expiry
    assert spec.timeout_at_ms == (None if timeout_ms is None else start_ms + timeout_ms)


@pytest.mark.parametrize(("deadline_ms", "expiry"), [(None, 120_000), (30_000, 30_000), (-1_000, 0)])
def test_an_admitted_command_carries_what_the_runner_is_given(deadline_ms: int | None, expiry: int) -> None:
    directive = {**COMMAND_DIRECTIVE, "timing": {"mode": "sync", "timeout_ms": 500}}
    if deadline_ms is not None:
        directive["timing"]["deadline_at"] = format_time(START + timedelta(milliseconds=deadline_ms))
    admitted = _plan(directive)
    assert isinstance(admitted, AdmittedCommand)
    assert admitted.command == CommandAction.from_catalog(CATALOG.actions[REDACT])
    assert (admitted.owner, admitted.mode, admitted.timeout_ms) == ("alice", "sync", 500)
    assert admitted.created_at == NOW
    assert admitted.input == {"text": "Canary-77"}
    assert to_ms(admitted.expires_at) - to_ms(START) == expiry
    assert admitted.causal_context is None


def test_the_operator_at_the_terminal_is_admitted_without_a_grant() -> None:
    with pytest.raises(SensoriumError) as info:
        _plan(SCAN_DIRECTIVE, OPERATOR)
    assert info.value.code == "forbidden"
    usb = {"transport": "usb-serial", "window_seconds": 10, "filters": {"vid_pid": [{"vid": 1, "pid": 2}]}}
    admitted = _plan(_changed(SCAN_DIRECTIVE, (("input",), usb)), OPERATOR, check_grant=False)
    assert isinstance(admitted, AdmittedScan) and admitted.session.owner == "ops"
    # Every other step still runs.
    with pytest.raises(AdmissionError) as refused:
        _plan(_changed(SCAN_DIRECTIVE, BAD_WINDOW), OPERATOR, check_grant=False)
    assert refused.value.code == "invalid-input"


@pytest.mark.parametrize(
    ("fail_after", "rounding", "seconds"),
    [
        (timedelta(seconds=299, microseconds=999500), "down", 299),
        (timedelta(seconds=299, microseconds=999500), "up", 300),
        (timedelta(seconds=300), "down", 300),
        (timedelta(seconds=300), "up", 300),
        (timedelta(seconds=-3), "up", 0),
    ],
)
def test_one_deferred_handle_builder_with_its_rounding(
    fail_after: timedelta, rounding: Literal["down", "up"], seconds: int
) -> None:
    handle = deferred_handle("op", "act", retry_after_seconds=0, fail_after=fail_after, rounding=rounding)
    assert handle["fail_after_seconds"] == seconds
    assert handle["retry_after_seconds"] == 0
    assert "cancel/unavailable-reason" not in handle
    refused = deferred_handle(
        "op", "act", retry_after_seconds=1, fail_after=fail_after, rounding=rounding,
        cancel_unavailable_reason="r",
    )
    assert refused["cancel/unavailable-reason"] == "r" and "cancel_path" not in refused
