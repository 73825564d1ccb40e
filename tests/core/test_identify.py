"""`identify`: admission steps 2-3, the operations-only rule and the keyed id, run once for an edge that looks
the operation up before admitting it; `plan_admission` given its answer plans the same and checks nothing
twice."""

from __future__ import annotations

from typing import Any

import pytest

from connector.core import admission
from connector.core.admission import AdmittedCommand, identify, plan_admission
from connector.core.ids import keyed_operation_id
from connector.core.policy import DeferredHostPolicy
from connector.errors import SensoriumError
from tests.core.test_admission import (
    ALICE,
    BAD_SCHEMA,
    CATALOG,
    COMMAND_DIRECTIVE,
    INFO,
    NOW,
    REDACT,
    SCAN_DIRECTIVE,
    SYNC_MODE,
    UNKNOWN_ACTION,
    _changed,
    _Entropy,
)


def _plan(directive: Any, **options: Any) -> Any:
    return plan_admission(
        directive,
        principal=ALICE,
        catalog=CATALOG,
        policy=DeferredHostPolicy(),
        now=NOW,
        entropy=_Entropy(),
        **options,
    )


def test_the_keyed_id_comes_from_the_principal_the_action_and_the_key() -> None:
    known = identify(SCAN_DIRECTIVE, principal=ALICE, catalog=CATALOG)
    assert (known.action.action_id, known.key) == (SCAN_DIRECTIVE["action_id"], "key-1")
    assert known.keyed_id == keyed_operation_id("alice", SCAN_DIRECTIVE["action_id"], "key-1")
    by_op = identify(SCAN_DIRECTIVE, principal=ALICE, catalog=CATALOG, op_key="bus-1")
    assert by_op.key == "bus-1" and by_op.keyed_id == keyed_operation_id(
        "alice", by_op.action.action_id, "bus-1"
    )
    unkeyed = identify(COMMAND_DIRECTIVE, principal=ALICE, catalog=CATALOG)
    assert unkeyed.key is None and unkeyed.keyed_id is None


@pytest.mark.parametrize(
    ("edits", "code"),
    [
        ([BAD_SCHEMA], "invalid-directive"),
        ([UNKNOWN_ACTION], "unknown-action"),
        ([SYNC_MODE, UNKNOWN_ACTION], "unknown-action"),  # the catalog first, then the operations-only rule
        ([SYNC_MODE, BAD_SCHEMA], "invalid-directive"),
        ([SYNC_MODE], "execution-mode-not-supported"),
    ],
)
def test_operations_only_refuses_a_sync_directive_after_steps_2_and_3(
    edits: list[tuple[tuple[str, ...], Any]], code: str
) -> None:
    with pytest.raises(SensoriumError) as refused:
        identify(_changed(SCAN_DIRECTIVE, *edits), principal=ALICE, catalog=CATALOG, operations_only=True)
    assert refused.value.code == code


def test_a_sync_command_is_refused_only_where_operations_only() -> None:
    sync_info = {**COMMAND_DIRECTIVE, "action_id": INFO, "timing": {"mode": "sync"}, "input": {}}
    assert identify(sync_info, principal=ALICE, catalog=CATALOG).action.action_id == INFO
    with pytest.raises(SensoriumError) as refused:
        identify(sync_info, principal=ALICE, catalog=CATALOG, operations_only=True)
    assert refused.value.code == "execution-mode-not-supported"


def test_a_plan_given_its_identification_is_the_same_and_checks_the_schema_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    keyed = {**COMMAND_DIRECTIVE, "action_id": REDACT, "idempotency_key": "k-1"}
    expected = _plan(keyed)
    checks: list[str] = []
    real = admission.check_directive

    def counted(directive: Any) -> Any:
        checks.append("schema")
        return real(directive)

    monkeypatch.setattr(admission, "check_directive", counted)
    known = identify(keyed, principal=ALICE, catalog=CATALOG)
    planned = _plan(keyed, identified=known)
    assert checks == ["schema"]
    assert isinstance(planned, AdmittedCommand) and planned == expected
