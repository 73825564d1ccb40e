"""Strict JSON for every document a caller sends (CONTRACT §1, last paragraph; CONTRACT §14).

Rules of this file:
- not strict JSON is `invalid-json` (400): bytes that are not UTF-8 or not JSON, `NaN`, `Infinity`,
  `-Infinity`, a string holding a lone surrogate (as a key or a value), an object with a duplicate key,
  nesting deeper than `MAX_DEPTH`;
- a number with a zero fraction or an exponent that is an integer (`510511.0`, `5e3`, `-0.0`) is that
  integer, as JSON Schema 2020-12 and RFC 8785 read it;
- strict JSON holding a number that is not an integer within +-(2^53 - 1) (a fraction, `1e400`) is
  refused with 422: `invalid-input` when the number sits in a directive's `input` or in a request that is
  not a directive, `invalid-directive` elsewhere in a directive;
- the parser itself refuses: the hooks of the standard library decoder see every constant, number, string
  and object as it is read, so no value that cannot be encoded again ever reaches admission;
- refusals name a path of known keys and a rule, never a value or a caller-chosen key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from decimal import Decimal
from json import scanner
from typing import Any, Final

from connector.errors import AdmissionError, Code, SensoriumError

MAX_DEPTH: Final = 64
MAX_SAFE_INTEGER: Final = 2**53 - 1
_SAFE_DIGITS: Final = len(str(MAX_SAFE_INTEGER))
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Top-level keys of `sensorium-directive.v1`: only these are ever named in a diagnostic.
_DIRECTIVE_KEYS: Final = frozenset(
    {
        "schema",
        "action_id",
        "timing",
        "input",
        "idempotency_key",
        "correlation/id",
        "causal/context",
        "extensions",
    }
)


class _Refused:
    """Stands in for a number strict JSON does not carry, until the parse is over and its path is known."""

    __slots__ = ()


_REFUSED: Final = _Refused()


class _NotStrict(ValueError):
    """Raised inside the decoder: the text is not strict JSON."""


def _no_constant(_: str) -> Any:
    raise _NotStrict("non-finite number")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _NotStrict("duplicate key")
    for key in document:
        if _SURROGATE.search(key):
            raise _NotStrict("lone surrogate")
    return document


class _Numbers:
    """The number hooks of one parse, and how many numbers they refused.

    An object of its own: hooks bound to the decoder would make each decoder a reference cycle (decoder
    -> scanner -> hook -> decoder), garbage that only a full collection frees.
    """

    __slots__ = ("refused",)

    def __init__(self) -> None:
        self.refused = 0

    def integer(self, text: str) -> Any:
        """An integer's text: its value, or `_REFUSED` beyond +-(2^53 - 1)."""
        # Long digit strings are never converted (time, and int's own digit limit).
        value = None if len(text.lstrip("-")) > _SAFE_DIGITS else int(text)
        if value is not None and -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
            return value
        self.refused += 1
        return _REFUSED

    def fraction(self, text: str) -> Any:
        """A number with a fraction or an exponent: the integer it spells, else `_REFUSED`."""
        # A zero fraction or an exponent may spell an integer (`5.0`, `5e3`): JSON Schema 2020-12 and
        # RFC 8785 read it as that integer. Decimal reads the text exactly; `adjusted()` bounds the
        # magnitude before any conversion, so `1e999999999` costs nothing.
        number = Decimal(text)
        if number.is_zero():
            return 0
        if number.adjusted() < _SAFE_DIGITS and number == number.to_integral_value():
            value = int(number)
            if -MAX_SAFE_INTEGER <= value <= MAX_SAFE_INTEGER:
                return value
        self.refused += 1
        return _REFUSED


def _checked_string(text: str, end: int, strict: bool = True) -> tuple[str, int]:
    value, after = _PLAIN_SCANSTRING(text, end, strict)
    if _SURROGATE.search(value):
        raise _NotStrict("lone surrogate")
    return value, after


_PLAIN_SCANSTRING: Callable[[str, int, bool], tuple[str, int]] = getattr(json.decoder, "scanstring")  # noqa: B009


class _StrictDecoder(json.JSONDecoder):
    """The standard decoder with every hook strict; strings are checked as they are scanned.

    `scan_strings`: False lets the C scanner read the strings (10x sooner), for a text in which no string
    can decode to a lone surrogate (`_needs_python_scanner`); keys are checked either way (`_unique_keys`).
    """

    def __init__(self, *, scan_strings: bool = True) -> None:
        self.numbers = _Numbers()
        super().__init__(
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_float=self.numbers.fraction,
            parse_int=self.numbers.integer,
        )
        self.parse_string = _checked_string
        # The C scanner reads strings itself; the Python one calls `parse_string` for every string value.
        if scan_strings:
            self.scan_once = getattr(scanner, "py_make_scanner")(self)  # noqa: B009  (untyped in typeshed)

    @property
    def refused(self) -> int:
        """Numbers refused so far."""
        return self.numbers.refused


def loads(raw: bytes | str, *, directive_at: Sequence[str] | None = ()) -> Any:
    """The value of a strict JSON document, or a refusal (400 `invalid-json`, 422 for numbers).

    `directive_at` is the path of the directive inside the document (`()`: the document is one; None: it
    holds none), which decides between `invalid-directive` and `invalid-input` for a refused number.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        if _SURROGATE.search(text):
            raise _NotStrict("lone surrogate")
        decoder = _StrictDecoder(scan_strings=_needs_python_scanner(text))
        value = decoder.decode(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SensoriumError("the body is not strict JSON", code=Code.INVALID_JSON) from None
    if _depth_exceeds(value, MAX_DEPTH):
        raise SensoriumError("the body nests too deeply", code=Code.INVALID_JSON)
    path = _refused_path(value) if decoder.refused else None
    if path is not None:
        raise _number_refusal(path, directive_at)
    return value


def _needs_python_scanner(text: str) -> bool:
    """Whether only the Python scanner may read this text: it escapes a surrogate (`\\ud800`-`\\udfff`),
    which could decode to a lone one, or nests enough for the two scanners' recursion limits to part."""
    # Every opening bracket counted, inside strings too: at most `MAX_DEPTH` of them cannot nest deeper.
    return _SURROGATE_ESCAPE.search(text) is not None or text.count("[") + text.count("{") > MAX_DEPTH


def _number_refusal(path: Sequence[str | int], directive_at: Sequence[str] | None) -> AdmissionError:
    """422 naming the directive section (a known key) that holds the number, never the value."""
    code, pointer = Code.INVALID_INPUT, "/"
    prefix = tuple(directive_at) if directive_at is not None else None
    if prefix is not None and tuple(path[: len(prefix)]) == prefix and len(path) > len(prefix):
        section = path[len(prefix)]
        code = Code.INVALID_INPUT if section == "input" else Code.INVALID_DIRECTIVE
        known = isinstance(section, str) and section in _DIRECTIVE_KEYS
        parts = [*prefix, section] if known else list(prefix)
        pointer = "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)
    return AdmissionError(
        "numbers must be integers within +-(2^53 - 1)",
        code=code,
        diagnostics=[{"code": code, "message": f"{pointer}: safe-integer"}],
    )


def _refused_path(value: Any) -> list[str | int] | None:
    """The path of the first refused number, if any (iterative: no recursion)."""
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        item, path = stack.pop()
        if item is _REFUSED:
            return path
        if isinstance(item, dict):
            stack.extend((child, [*path, key]) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((child, [*path, index]) for index, child in reversed(list(enumerate(item))))
    return None


def _depth_exceeds(value: Any, limit: int) -> bool:
    """True when arrays and objects nest deeper than `limit` (iterative: no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False
