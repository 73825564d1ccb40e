"""The registry's fast canonical encoding is byte for byte RFC 8785 (it feeds every history digest)."""

from __future__ import annotations

from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

from connector.storage.registry import canonical

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _json_values, max_size=6))
def test_the_fast_canonical_encoding_is_rfc_8785(document: dict[str, Any]) -> None:
    try:
        expected = rfc8785.dumps(document)
    except Exception as error:  # values RFC 8785 refuses (huge integers) are refused alike
        with pytest.raises(type(error)):
            canonical(document)
        return
    assert canonical(document) == expected


@pytest.mark.parametrize(
    "document",
    [
        {
            "c": '\x00\x08\x1f\x7f\u2028"\\/é\U0001f600',
            "n": [-(2**53) + 1, 2**53 - 1, True, None],
        },  # fast path
        {"é": 1, "\U0001f600": 2, "\uffff": 3},  # key order by UTF-16 code units
        {"f": 0.1, "g": 1e21, "h": -0.0},  # numbers in ECMAScript form
    ],
)
def test_hard_cases_encode_as_rfc_8785(document: dict[str, Any]) -> None:
    assert canonical(document) == rfc8785.dumps(document)
