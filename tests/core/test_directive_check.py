"""Step 2's check takes the model path first: it must refuse exactly what the schema path refuses, in the
schema path's words (every directive vector, and edges where a regex engine or a type rule could part)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from connector.contract.validate import validate
from connector.core.admission import DIRECTIVE_SCHEMA, MAX_DIAGNOSTICS, check_directive
from connector.errors import AdmissionError
from tests.contract.vectors import VECTORS

BASE: dict[str, Any] = {
    "schema": "sensorium-directive.v1",
    "action_id": "device.discovery.scan",
    "timing": {"mode": "async", "status_versions": [2]},
    "input": {"transport": "ble", "window_seconds": 1},
}
# (where, value): a member of the directive (or of `timing`) set to a value near a rule's edge.
EDGES: list[tuple[tuple[str, ...], Any]] = [
    (("action_id",), "device.discovery.scan\n"),  # Python's `$` matches before a final newline
    (("action_id",), "device.scan.\u0661"),  # a non-ASCII digit
    (("action_id",), "a" * 128),
    (("action_id",), "a" * 129),
    (("action_id",), ""),
    (("action_id",), 7),
    (("timing", "deadline_at"), "2026-12-02T03:00:00Z"),
    (("timing", "deadline_at"), "2026-12-02T03:00:00Z\n"),
    (("timing", "deadline_at"), "2026-12-02T03:00:00.5+00:00"),
    (("timing", "deadline_at"), "\u0662026-12-02T03:00:00Z"),
    (("timing", "timeout_ms"), True),
    (("timing", "timeout_ms"), -1),
    (("timing", "timeout_ms"), 2**53 - 1),
    (("timing", "status_versions"), [1, True]),
    (("timing", "status_versions"), []),
    (("timing", "status_versions"), [2, 2]),
    (("timing", "mode"), None),
    (("timing", "extra"), 1),
    (("idempotency_key",), ""),
    (("idempotency_key",), "k" * 257),
    (("idempotency_key",), None),
    (("correlation/id",), "c"),
    (("causal/context",), {"operation/id": "op", "trace/id": None}),
    (("causal/context",), {"operation/id": "op", "extra": [1, {"x": None}]}),
    (("causal/context",), {}),
    (("extensions",), []),
    (("extensions",), {"any": None}),
    (("input",), []),
    (("schema",), "sensorium-directive.v2"),
    (("surplus",), 1),
]


def _reference(directive: Any) -> list[dict[str, str]] | None:
    """What the schema path alone answers: None (admitted) or the refusal's diagnostics."""
    messages = [str(v) for v in validate(DIRECTIVE_SCHEMA, directive, via="schema")]
    return [{"code": "invalid-directive", "message": m} for m in messages[:MAX_DIAGNOSTICS]] or None


def _answer(directive: Any) -> list[dict[str, str]] | None:
    try:
        check_directive(directive)
    except AdmissionError as error:
        assert error.code == "invalid-directive"
        return [dict(d) for d in error.diagnostics]
    return None


def _with(where: tuple[str, ...], value: Any) -> dict[str, Any]:
    directive = copy.deepcopy(BASE)
    node = directive
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    return directive


@pytest.mark.parametrize("vector", [v for v in VECTORS if v.schema == DIRECTIVE_SCHEMA], ids=lambda v: v.id)
def test_every_directive_vector_answers_as_the_schema_path(vector: Any) -> None:
    assert _answer(vector.document()) == _reference(vector.document())


@pytest.mark.parametrize(("where", "value"), EDGES, ids=[f"{'/'.join(w)}={v!r}"[:60] for w, v in EDGES])
def test_edges_answer_as_the_schema_path(where: tuple[str, ...], value: Any) -> None:
    directive = _with(where, value)
    assert _answer(directive) == _reference(directive)


def test_the_edges_hold_both_verdicts() -> None:
    verdicts = {_reference(_with(where, value)) is None for where, value in EDGES}
    assert verdicts == {True, False}
