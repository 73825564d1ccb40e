"""The error-code table (`connector.errors.CODES`) states every code once: all the code base raises or records
is in it, CONTRACT §14 agrees with it, and the OpenAPI builder and the Bus map read it."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from connector.api import openapi
from connector.bus import messages
from connector.core.lifecycle import BusState, Status
from connector.errors import CODES, HTTP_STATUS_BY_CODE, BusAnswer, Code, SensoriumError
from tests.support.paths import REPO

# Keyword arguments and class attributes that carry an error code (a diagnostic's `code` key too).
CODE_NAMES = frozenset({"code", "error_code", "missing_code", "default_code"})
ROOTS = ("connector", "providers")
# CONTRACT §14 names it in the 409 row, but the code base never answers it over HTTP: it is the host's
# continuation diagnostic (CONTRACT §11), and the table keeps it HTTP-less so no refusal changes.
CONTRACT_ONLY_HTTP = frozenset({Code.DEFERRED_NOT_ACCEPTED})


def _module_strings(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "literal"` constants (plain or annotated)."""
    found: dict[str, str] = {}
    for node in tree.body:
        target: ast.expr | None = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def _literal(node: ast.expr | None, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _code_nodes(tree: ast.Module) -> Iterator[ast.expr | None]:
    """Every expression given as a code: `code=...` keywords, `default_code = ...`, `{"code": ...}`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg in CODE_NAMES:
            yield node.value
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id in CODE_NAMES for t in targets):
                yield node.value
        elif isinstance(node, ast.Dict):
            yield from (v for k, v in zip(node.keys, node.values, strict=True) if _is_code_key(k))


def _is_code_key(key: ast.expr | None) -> bool:
    return isinstance(key, ast.Constant) and key.value == "code"


def codes_of(tree: ast.Module) -> dict[str, int]:
    """code -> first line, for every code given as a literal or a module constant (`Code.X` is in by type)."""
    constants = _module_strings(tree)
    found: dict[str, int] = {}
    for node in _code_nodes(tree):
        code = _literal(node, constants)
        if code and node is not None:  # an empty default names no code
            found.setdefault(code, node.lineno)
    return found


def raised_codes() -> dict[str, str]:
    """code -> first place, over the production tree."""
    found: dict[str, str] = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            codes = codes_of(ast.parse(path.read_text(encoding="utf-8")))
            for code, line in codes.items():
                found.setdefault(code, f"{path.relative_to(REPO)}:{line}")
    return found


def test_every_code_the_code_base_raises_is_in_the_table() -> None:
    found = raised_codes()
    assert found, "the scan found no code at all"
    missing = {code: place for code, place in found.items() if code not in CODES and not _is_rule(place)}
    assert not missing, f"codes outside connector.errors.CODES: {missing}"


def _is_rule(place: str) -> bool:
    """A diagnostic entry whose `code` names the broken rule (`enum`, `closed-object`), not an error."""
    path, line = place.rsplit(":", 1)
    text = (REPO / path).read_text(encoding="utf-8").splitlines()[int(line) - 1]
    return bool(re.search(r"""\{\s*"code":""", text)) and "message" in text


SCANNED = """
GONE = "code-by-constant"
class E(Exception):
    default_code = "code-by-default"
def f():
    raise E("x", code="code-by-keyword")
    raise E("x", code=GONE)
    return {"code": "code-by-entry", "message": "m"}, Outcome(error_code="code-by-outcome")
def g(code="not-a-code-parameter"):
    return E("x", code=Code.INTERNAL), {"status": "failed"}
"""


def test_the_scan_sees_codes_given_as_literals_constants_and_defaults() -> None:
    found = codes_of(ast.parse(SCANNED))
    expected = {"code-by-constant", "code-by-default", "code-by-keyword", "code-by-entry", "code-by-outcome"}
    assert set(found) == expected


def test_every_code_has_a_description_and_a_bus_answer() -> None:
    assert set(CODES) == set(Code)
    for code, facts in CODES.items():
        assert facts.description and len(facts.description) <= 100, code
        assert isinstance(facts.bus, BusAnswer)
        # A refusal reaches the Bus as a refusal (or `unknown`); a code without HTTP never is a Bus refusal.
        refusal = facts.bus in (BusAnswer.REFUSED, BusAnswer.UNKNOWN)
        assert refusal == (facts.http_status is not None), code


def _contract_http_rows() -> dict[str, int]:
    text = (REPO / "docs" / "CONTRACT.md").read_text(encoding="utf-8")
    section = text.split("## 14. Error codes", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, int] = {}
    for status, codes in re.findall(r"^\| (\d{3}) \| (.+?) \|", section, re.M):
        rows.update({code: int(status) for code in re.findall(r"`([a-z0-9-]+)`", codes)})
    return rows


def test_http_statuses_are_contract_section_14() -> None:
    rows = _contract_http_rows()
    assert len(rows) > 20
    assert {c: s for c, s in rows.items() if c not in CONTRACT_ONLY_HTTP} == dict(HTTP_STATUS_BY_CODE)
    assert all(CODES[c].http_status is None for c in CONTRACT_ONLY_HTTP)


def test_terminal_codes_of_contract_section_14_are_outcomes() -> None:
    text = (REPO / "docs" / "CONTRACT.md").read_text(encoding="utf-8")
    sentence = text.split("Terminal `error.code` values on statuses:", 1)[1].split("Status diagnostics", 1)[0]
    named = set(re.findall(r"`([a-z0-9-]+)`", sentence))
    assert named == {c for c, f in CODES.items() if f.bus in (BusAnswer.FAILED, BusAnswer.LOST)}


def test_the_exception_classes_take_their_code_from_the_table() -> None:
    classes: list[type[SensoriumError]] = [SensoriumError, *_subclasses(SensoriumError)]
    for cls in classes:
        assert cls.default_code in CODES, cls
        assert type(SensoriumError("x", code=cls.default_code).code) is str  # a plain string on every wire


def _subclasses(cls: type[SensoriumError]) -> list[type[SensoriumError]]:
    import connector.core.lifecycle
    import connector.core.policy
    import connector.storage.registry  # noqa: F401 - their error classes register as subclasses

    found: list[type[SensoriumError]] = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


def _route_refusals(document: dict[str, Any]) -> Iterator[tuple[int, str]]:
    for methods in document["paths"].values():
        for operation in methods.values():
            for status, response in operation["responses"].items():
                schema = response.get("content", {}).get("application/json", {}).get("schema", {})
                for code in schema.get("properties", {}).get("code", {}).get("enum", ()):
                    yield int(status), code


def test_the_openapi_builder_reads_the_table() -> None:
    route = openapi.Route(oks=(openapi.Ok(200),), refusals=tuple(HTTP_STATUS_BY_CODE))
    document = {"paths": {"/x": {"get": openapi._operation(route)}}}
    answered = {code: status for status, code in _route_refusals(document)}
    assert answered == dict(HTTP_STATUS_BY_CODE)
    declared = {*openapi.ANY_ROUTE_REFUSALS, *openapi.EDGE_REFUSALS, *openapi.ADMISSION_REFUSALS}
    assert declared | openapi.RETRY_AFTER_CODES <= HTTP_STATUS_BY_CODE.keys()


def test_a_code_without_an_http_status_cannot_be_declared_on_a_route() -> None:
    route = openapi.Route(oks=(openapi.Ok(200),), refusals=(Code.PROVIDER_FAILURE,))
    with pytest.raises(KeyError):
        openapi._operation(route)


@pytest.mark.parametrize("code", sorted(Code))
def test_the_bus_map_agrees_with_the_table(code: Code) -> None:
    assert messages.bus_answer(code) is CODES[code].bus
    facts = CODES[code]
    if facts.bus is BusAnswer.UNKNOWN:
        reply = messages.refusal_reply("op-1", SensoriumError("x", code=code))
        assert reply == {"op": "op-1", "state": "unknown"}
    elif facts.bus is BusAnswer.REFUSED:
        reply = messages.refusal_reply("op-1", SensoriumError("x", code=code), state=BusState.RUNNING)
        assert reply["error"]["code"] == code and reply["state"] == "running"
    elif facts.bus in (BusAnswer.FAILED, BusAnswer.LOST):
        state, reason = messages.record_state(_FailedRecord(code))
        assert state.value == facts.bus.value and reason == code


def test_the_bus_map_knows_no_code_of_its_own() -> None:
    assert messages.bus_answer(None) is BusAnswer.NONE
    assert messages.bus_answer("no-such-code") is BusAnswer.NONE


class _FailedRecord:
    """A durable record `failed` with one error code."""

    def __init__(self, code: str) -> None:
        stamp = datetime(2026, 1, 1, tzinfo=UTC)
        self.operation_id = "op-1"
        self.operation_kind = "command"
        self.capability_id = "a"
        self.owner = "alice"
        self.status = Status.FAILED.value
        self.last_error = code
        self.expires_at = self.created_at = self.updated_at = stamp
        self.bus_op = None
        self.metadata: dict[str, Any] = {}

