"""Every vector through both validation paths: the verdicts, the rule names and the sidecars agree."""

from __future__ import annotations

import pytest

from connector.contract.schemas import schema_names, schema_rules, schema_violations
from connector.contract.semantic import SEMANTIC_RULES, STATUS_SCHEMAS
from connector.contract.validate import validate
from connector.contract.violations import SCHEMA_RULE
from tests.contract.vectors import CATALOG_SCHEMAS, INVALID, VECTORS, Vector

# The semantic rules SPEC 1 names, each of which must have a vector of its own.
SPEC_RULES = {
    "one-cancel-surface",
    "result-only-on-completed",
    "retry-after-only-non-terminal",
    "revision-monotonic",
    "same-revision-same-snapshot",
    "changed-snapshot-higher-revision",
    "terminal-is-final",
    "shared-operation-id",
    "final-snapshot-equality",
    "final-revision-equality",
    "completed-cleanup-confirmed",
    "cancelled-requires-confirmed",
    "claim-released-requires-confirmed-cleanup",
    "snapshot-max-candidates",
    "snapshot-max-bytes",
    "no-progress-while-cancel-requested",
    "confirmed-at-only-when-confirmed",
    "erased-result-shape",
}


def _rules(vector: Vector, via: str) -> set[str]:
    return {v.rule for v in validate(vector.schema, vector.document(), via=via)}  # type: ignore[arg-type]


@pytest.mark.parametrize("name", schema_names())
def test_every_schema_has_enough_vectors(name: str) -> None:
    mine = [v for v in VECTORS if v.schema == name]
    assert sum(v.valid for v in mine) >= 3
    assert sum(not v.valid for v in mine) >= 6


def test_vectors_exist_only_for_known_schemas() -> None:
    assert {v.schema for v in VECTORS} == set(schema_names())


@pytest.mark.parametrize("vector", INVALID, ids=lambda v: v.id)
def test_sidecar_names_a_rule_and_a_layer(vector: Vector) -> None:
    expect = vector.expectation()
    assert set(expect) == {"rule", "layer"}
    assert expect["layer"] in ("schema", "semantic")
    assert expect["rule"] == SCHEMA_RULE or expect["rule"] in SEMANTIC_RULES | schema_rules()


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.id)
def test_only_status_vectors_are_poll_lists(vector: Vector) -> None:
    if isinstance(vector.document(), list):
        assert vector.schema in STATUS_SCHEMAS
        assert len(vector.document()) >= 2


@pytest.mark.parametrize("via", ["schema", "model"])
@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.id)
def test_vector_verdict(vector: Vector, via: str) -> None:
    found = _rules(vector, via)
    if vector.valid:
        assert found == set()
    else:
        assert vector.expectation()["rule"] in found


@pytest.mark.parametrize("vector", VECTORS, ids=lambda v: v.id)
def test_both_paths_agree(vector: Vector) -> None:
    by_schema = validate(vector.schema, vector.document(), via="schema")
    by_model = validate(vector.schema, vector.document(), via="model")
    assert bool(by_schema) == bool(by_model)
    if not vector.valid:
        rule = vector.expectation()["rule"]
        assert rule in {v.rule for v in by_schema} & {v.rule for v in by_model}
    if vector.schema not in CATALOG_SCHEMAS:
        assert by_schema == by_model  # same paths, same rules, same order


@pytest.mark.parametrize("vector", INVALID, ids=lambda v: v.id)
def test_layer_is_the_first_layer_that_names_the_rule(vector: Vector) -> None:
    expect, document = vector.expectation(), vector.document()
    polls = document if isinstance(document, list) else [document]
    schema_only = {v.rule for poll in polls for v in schema_violations(vector.schema, poll)}
    if expect["layer"] == "schema":
        assert expect["rule"] in schema_only
    else:
        assert schema_only == set()  # the schema cannot see it at all
        assert expect["rule"] in _rules(vector, "schema")


def test_every_named_rule_has_its_own_vector() -> None:
    named = {v.expectation()["rule"] for v in INVALID}
    assert named >= SPEC_RULES
    assert (SEMANTIC_RULES | schema_rules()) <= named
