"""CONTRACT §1 (last paragraph) and 14: the strict parser every edge uses (issue D5)."""

from __future__ import annotations

import json

import pytest

from connector.contract import strict_json
from connector.errors import SensoriumError

CANARY = "canary-7f3a"


def refusal(raw: bytes | str, directive_at: tuple[str, ...] | None = ()) -> SensoriumError:
    with pytest.raises(SensoriumError) as refused:
        strict_json.loads(raw, directive_at=directive_at)
    assert CANARY not in str(refused.value) and CANARY not in repr(refused.value.diagnostics)
    return refused.value


@pytest.mark.parametrize(
    "raw",
    [
        b'{"x": NaN}',
        b'{"x": Infinity}',
        b'{"x": -Infinity}',
        b"[1, NaN]",
        b'{"x": "\\ud800"}',
        b'{"x": ["ok", "\\udfff"]}',
        b'"\\ud83d"',
        b'{"\\ud800": 1}',
        b'{"x": 1, "x": 2}',
        b'{"a": {"' + CANARY.encode() + b'": 1, "' + CANARY.encode() + b'": 1}}',
        b"\xed\xa0\x80",  # a surrogate in UTF-8 bytes: not UTF-8
        b"{" + CANARY.encode(),
        b"",
        b"[" * 100 + b"]" * 100,
    ],
)
def test_what_is_not_strict_json_is_invalid_json(raw: bytes) -> None:
    assert refusal(raw).code == "invalid-json"


def test_a_lone_surrogate_in_a_str_document_is_refused_too() -> None:
    assert refusal('{"x": "\ud800"}').code == "invalid-json"


@pytest.mark.parametrize(
    ("raw", "code", "pointer"),
    [
        (b'{"input": {"window_seconds": 1e400}}', "invalid-input", "/input"),
        (b'{"input": {"a": [1, 2, 9007199254740992]}}', "invalid-input", "/input"),
        (b'{"input": {"a": -9007199254740992}}', "invalid-input", "/input"),
        (b'{"input": {"a": 1.25}}', "invalid-input", "/input"),
        (b'{"input": {"a": 1e-3}}', "invalid-input", "/input"),
        (b'{"input": {"a": -6.6e16}}', "invalid-input", "/input"),
        (b'{"input": {"a": 9.007199254740992e15}}', "invalid-input", "/input"),
        (b'{"input": {"a": 1e999999999}}', "invalid-input", "/input"),
        (b'{"timing": {"mode": "async", "timeout_ms": 1.5}}', "invalid-directive", "/timing"),
        (b'{"causal/context": {"operation/id": "x", "n": 1.25E1}}', "invalid-directive", "/causal~1context"),
        (b'{"' + CANARY.encode() + b'": 12345678901234567890}', "invalid-directive", "/"),
        (b'{"x": ' + b"9" * 5000 + b"}", "invalid-directive", "/"),
    ],
)
def test_numbers_that_are_not_safe_integers_are_422(raw: bytes, code: str, pointer: str) -> None:
    refused = refusal(raw)
    assert (refused.code, list(refused.diagnostics)) == (
        code,
        [{"code": code, "message": f"{pointer}: safe-integer"}],
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("510511.0", 510511),
        ("5e3", 5000),
        ("5E+3", 5000),
        ("100e-2", 1),
        ("-0.0", 0),
        ("0e999999999", 0),
        ("9.007199254740991e15", 9007199254740991),
        ("-9007199254740991.000", -9007199254740991),
        ("1." + "0" * 2000, 1),
    ],
)
def test_an_integral_number_is_that_integer_anywhere(text: str, value: int) -> None:
    timing, inputs, context = f'{{"timeout_ms": {text}}}', f'{{"a": [{text}]}}', f'{{"n": {text}}}'
    raw = f'{{"timing": {timing}, "input": {inputs}, "causal/context": {context}}}'
    document = strict_json.loads(raw.encode())
    numbers = (document["timing"]["timeout_ms"], document["input"]["a"][0], document["causal/context"]["n"])
    assert numbers == (value, value, value) and all(type(n) is int for n in numbers)


def test_a_request_that_holds_no_directive_says_invalid_input() -> None:
    assert refusal(b'{"candidate/ref": 1e400}', directive_at=None).code == "invalid-input"
    nested = refusal(
        b'{"op": "x", "directive": {"timing": {"timeout_ms": 0.5}}}', directive_at=("directive",)
    )
    assert (nested.code, nested.diagnostics[0]["message"]) == (
        "invalid-directive",
        "/directive/timing: safe-integer",
    )
    outside = refusal(b'{"op": 1.5, "directive": {}}', directive_at=("directive",))
    assert (outside.code, outside.diagnostics[0]["message"]) == ("invalid-input", "/: safe-integer")


def test_strict_documents_parse_as_the_standard_library_does() -> None:
    document = {
        "schema": "sensorium-directive.v1",
        "n": [0, -0, 9007199254740991, -9007199254740991],
        "s": "caf\u00e9 \U0001f600 \\u escape",
        "nested": {"a": [True, False, None, {"b": ""}]},
    }
    for raw in (json.dumps(document), json.dumps(document, ensure_ascii=False)):
        assert strict_json.loads(raw.encode()) == json.loads(raw)
    assert strict_json.loads(b'"\\ud83d\\ude00"') == "\U0001f600"  # a valid pair is one character
