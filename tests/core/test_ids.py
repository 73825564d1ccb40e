"""Operation ids and opaque ids: form, determinism, and what they may be derived from."""

from __future__ import annotations

import base64
import hashlib
import inspect
import json
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from connector.core.ids import (
    OPERATION_KIND,
    opaque_id,
    operation_id,
    random_operation_id,
)

FORM = re.compile(r"deferred:sensorium\.directive\.invoke:[A-Z2-7]{26}")
texts = st.text(max_size=64)


def _keyed(principal: str = "alice", action: str = "device.discovery.scan", key: str = "k-1") -> str:
    return operation_id(OPERATION_KIND, principal_id=principal, action_id=action, idempotency_key=key)


def test_kind_constant() -> None:
    assert OPERATION_KIND == "sensorium.directive.invoke"


def test_keyed_id_form_and_derivation() -> None:
    got = _keyed()
    assert FORM.fullmatch(got)
    # Independent derivation: RFC 8785 of a list of ASCII strings is compact JSON.
    canonical = json.dumps(["alice", "device.discovery.scan", "k-1"], separators=(",", ":")).encode()
    suffix = base64.b32encode(hashlib.sha256(canonical).digest()[:16]).decode().rstrip("=")
    assert got == f"deferred:{OPERATION_KIND}:{suffix}"


def test_keyed_id_is_stable_across_releases() -> None:
    # Golden value: changing it would split idempotent retries made across an upgrade.
    assert _keyed("p", "a", "k") == "deferred:sensorium.directive.invoke:HAZQTO5XRH6C4PSIOKGAA3ESKY"


@given(texts, texts, texts)
def test_keyed_id_is_deterministic_and_well_formed(principal: str, action: str, key: str) -> None:
    first = _keyed(principal, action, key)
    assert first == _keyed(principal, action, key)
    assert FORM.fullmatch(first)


@given(texts, texts, texts, texts)
def test_each_part_changes_the_id(principal: str, action: str, key: str, other: str) -> None:
    base = _keyed(principal, action, key)
    if other != principal:
        assert _keyed(other, action, key) != base
    if other != action:
        assert _keyed(principal, other, key) != base
    if other != key:
        assert _keyed(principal, action, other) != base


def test_parts_are_not_concatenated() -> None:
    assert _keyed("ab", "c", "d") != _keyed("a", "bc", "d")
    assert _keyed("a", "b", "cd") != _keyed("a", "bc", "d")


def test_only_principal_action_and_key_can_reach_the_id() -> None:
    # Input, scope and device data have no way in: the signature takes nothing else.
    parameters = inspect.signature(operation_id).parameters
    assert list(parameters) == ["kind", "principal_id", "action_id", "idempotency_key"]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in parameters.items() if name != "kind")
    with pytest.raises(TypeError):
        operation_id(  # type: ignore[call-arg]
            OPERATION_KIND, principal_id="p", action_id="a", idempotency_key="k", input={"transport": "ble"}
        )


def test_random_id() -> None:
    got = random_operation_id(OPERATION_KIND, bytes(range(16)))
    assert FORM.fullmatch(got)
    assert got.endswith(base64.b32encode(bytes(range(16))).decode().rstrip("="))
    assert random_operation_id(OPERATION_KIND, bytes(16)) != random_operation_id(OPERATION_KIND, b"\x01" * 16)


@pytest.mark.parametrize("size", [0, 15, 17, 32])
def test_random_id_needs_128_bits(size: int) -> None:
    with pytest.raises(ValueError):
        random_operation_id(OPERATION_KIND, bytes(size))


@given(st.binary(min_size=16, max_size=16))
def test_random_id_carries_its_entropy(entropy: bytes) -> None:
    text = random_operation_id(OPERATION_KIND, entropy)
    assert FORM.fullmatch(text)
    assert base64.b32decode(text.rsplit(":", 1)[1] + "======") == entropy


@pytest.mark.parametrize("kind", ["", "Sensorium", "a:b", "sensorium..invoke", ".x", "x y"])
def test_bad_kind_is_refused(kind: str) -> None:
    with pytest.raises(ValueError):
        random_operation_id(kind, bytes(16))
    with pytest.raises(ValueError):
        operation_id(kind, principal_id="p", action_id="a", idempotency_key="k")


def test_other_kinds_are_minted() -> None:
    text = random_operation_id("sensorium.other-kind.v2", bytes(16))
    assert text == "deferred:sensorium.other-kind.v2:" + "A" * 26


def test_opaque_id() -> None:
    got = opaque_id(bytes(range(16)))
    assert got == base64.urlsafe_b64encode(bytes(range(16))).decode().rstrip("=")
    assert len(got) == 22
    assert opaque_id(b"\xff" * 96) == "_" * 128


@given(st.binary(min_size=16, max_size=96))
def test_opaque_id_form(entropy: bytes) -> None:
    got = opaque_id(entropy)
    assert 1 <= len(got) <= 128
    assert re.fullmatch(r"[A-Za-z0-9_-]+", got)
    assert base64.urlsafe_b64decode(got + "=" * (-len(got) % 4)) == entropy


@pytest.mark.parametrize("size", [0, 8, 15, 97, 200])
def test_opaque_id_refuses_bad_entropy(size: int) -> None:
    with pytest.raises(ValueError):
        opaque_id(bytes(size))
