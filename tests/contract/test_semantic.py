"""Semantic rules and the combined `validate`: pointers, ordering, misuse, and robustness on any JSON."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from connector.contract.schemas import UnknownSchemaError
from connector.contract.semantic import STATUS_SCHEMAS, sequence_violations
from connector.contract.validate import validate
from connector.contract.violations import Violation, merge, ordered, pointer
from tests.contract.vectors import CATALOG_SCHEMAS, VECTORS

VALID_MINE = [v for v in VECTORS if v.valid and v.schema not in CATALOG_SCHEMAS]
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_pointer_escapes_slash_keys_and_tildes() -> None:
    assert pointer("causal/context", "operation/id") == "/causal~1context/operation~1id"
    assert pointer("a~b", 3) == "/a~0b/3"
    assert pointer() == ""


def test_violation_reads_path_colon_rule() -> None:
    assert (
        str(Violation("/progress/revision", "revision-monotonic")) == "/progress/revision: revision-monotonic"
    )
    assert str(Violation("", "one-cancel-surface")) == "/: one-cancel-surface"
    assert Violation("/status", "terminal-is-final").under("/2") == Violation(
        "/2/status", "terminal-is-final"
    )


def test_violations_come_in_document_order_without_duplicates() -> None:
    found = ordered(
        [Violation("/10", "b"), Violation("/2/x", "a"), Violation("/2/x", "a"), Violation("", "c")]
    )
    assert found == [Violation("", "c"), Violation("/2/x", "a"), Violation("/10", "b")]


def test_a_semantic_finding_supersedes_the_schema_finding_of_the_same_rule() -> None:
    structural = [Violation("", "profile-matches-class"), Violation("/x", "schema")]
    semantic = [Violation("/actions/0", "profile-matches-class")]
    assert merge(structural, semantic) == [
        Violation("/actions/0", "profile-matches-class"),
        Violation("/x", "schema"),
    ]


def test_cross_poll_rules_exist_for_status_schemas_only() -> None:
    with pytest.raises(ValueError, match="status schemas"):
        sequence_violations("sensorium-error.v1", [])
    with pytest.raises(ValueError, match="status schemas"):
        validate("sensorium-error.v1", [{}])


@pytest.mark.parametrize("via", ["schema", "model"])
def test_unknown_schema_names_are_refused(via: str) -> None:
    with pytest.raises(UnknownSchemaError):
        validate("sensorium-error.v9", {}, via=via)  # type: ignore[arg-type]


def test_an_empty_poll_list_breaks_no_rule() -> None:
    assert sequence_violations("deferred-operation-status.v2", []) == []


def test_the_revision_rules_compare_against_the_previous_poll_with_progress() -> None:
    vector = next(v for v in VALID_MINE if v.path.stem == "polls-until-cancelled")
    polls = vector.document()
    # The cancel-requested poll in between carries no progress; revision 1 may then follow revision 1.
    assert "progress" not in polls[1]
    reordered = [polls[0], polls[1], copy.deepcopy(polls[0])]
    assert sequence_violations(vector.schema, reordered) == []


@SETTINGS
@given(document=JSON, via=st.sampled_from(["schema", "model"]), index=st.integers(0, len(VALID_MINE) - 1))
def test_any_json_is_judged_without_crashing(document: Any, via: str, index: int) -> None:
    name = VALID_MINE[index].schema
    if isinstance(document, list) and name not in STATUS_SCHEMAS:
        with pytest.raises(ValueError, match="status schemas"):
            validate(name, document, via=via)  # type: ignore[arg-type]
        return
    found = validate(name, document, via=via)  # type: ignore[arg-type]
    assert found or document == []  # nothing random is ever a valid document
    assert all(isinstance(v, Violation) for v in found)


def _containers(node: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at] if isinstance(node, dict | list) else []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in children:
        found += _containers(child, (*at, key))
    return found


@SETTINGS
@given(data=st.data())
def test_both_paths_agree_on_mutated_valid_documents(data: st.DataObject) -> None:
    vector = data.draw(st.sampled_from(VALID_MINE), label="vector")
    document = vector.document()
    for _ in range(data.draw(st.integers(1, 3), label="mutations")):
        document = _mutate(document, data)
    by_schema = validate(vector.schema, document, via="schema")
    by_model = validate(vector.schema, document, via="model")
    assert by_schema == by_model


def _mutate(document: Any, data: st.DataObject) -> Any:
    at = data.draw(st.sampled_from(_containers(document)), label="at")
    target = document
    for key in at:
        target = target[key]
    if isinstance(target, dict) and target and data.draw(st.booleans(), label="delete"):
        del target[data.draw(st.sampled_from(sorted(target)), label="key")]
    elif isinstance(target, dict):
        keys = [*sorted(target), "extra", "label", "progress", "result", "error", "retry_after_seconds"]
        target[data.draw(st.sampled_from(keys), label="key")] = data.draw(JSON, label="value")
    elif target:
        target[data.draw(st.integers(0, len(target) - 1), label="index")] = data.draw(JSON, label="value")
    else:
        target.append(data.draw(JSON, label="value"))
    return document
