"""The strict parser reads most texts with the C scanner and the rest with the Python one: both answer alike,
and the texts that could part them (a surrogate escape, deep nesting) are always read by the Python one."""

from __future__ import annotations

from typing import Any

import pytest

from connector.contract import strict_json
from connector.errors import SensoriumError

TEXTS = [
    b'{"schema": "sensorium-directive.v1", "timing": {"mode": "async"}, "input": {"a": [1, 2.0, 5e3]}}',
    b'{"x": NaN}',
    b'{"x": -Infinity}',
    b'{"x": 1, "x": 2}',
    b'{"x": "a\\u00e9\\\\ud800"}',  # an escaped backslash before `ud800`: no surrogate
    b'{"x": "\\ud83d\\ude00"}',
    b'{"x": "\\ud800"}',
    b'{"\\udfff": 1}',
    b'{"x": "\\t\\n\\"", "y": "\x7f"}',
    b'{"x": "raw\ttab"}',
    b'{"input": {"a": 1.25}}',
    b'{"timing": {"timeout_ms": 1e400}}',
    b'{"x": ' + b"9" * 5000 + b"}",
    b'{"a": [true, false, null, {"b": ""}]} ',
    b'{"a": 1} trailing',
    b"[" * 64 + b"]" * 64,
    b"[" * 65 + b"]" * 65,
    b"[" * 400 + b"]" * 400,
    b"[" * 3000 + b"]" * 3000,
    b'{"a": "' + b"{" * 70 + b'"}',
    b"",
    b"{",
]


def _outcome(raw: bytes) -> tuple[str, Any]:
    try:
        return "value", strict_json.loads(raw, directive_at=())
    except SensoriumError as error:
        return error.code, (error.message, list(error.diagnostics))


@pytest.mark.parametrize("raw", TEXTS, ids=[t[:40].decode(errors="replace") for t in TEXTS])
def test_both_scanners_answer_alike(raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = _outcome(raw)
    monkeypatch.setattr(strict_json, "_needs_python_scanner", lambda _text: True)
    assert chosen == _outcome(raw)


@pytest.mark.parametrize(
    ("text", "python"),
    [
        ('{"x": "plain"}', False),
        ('{"x": "\\u00e9"}', False),
        ('{"x": "\\ud800"}', True),
        ('{"x": "\\uDBFF"}', True),
        ('{"x": "\\\\ud800"}', True),  # not a surrogate, but read the slow way: never the other way round
        ("[" * 64 + "]" * 64, False),
        ("[" * 65 + "]" * 65, True),
    ],
)
def test_texts_that_could_part_the_scanners_go_to_the_python_one(text: str, python: bool) -> None:
    assert strict_json._needs_python_scanner(text) is python
