"""Operator key files: generation, naming by key id, strict loading of trusted and private keys."""

from __future__ import annotations

import base64
import hashlib
import shutil
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from connector.catalog.keys import (
    PUBLISHED_TEST_KEY,
    b64url_decode,
    b64url_encode,
    generate_key_pair,
    holds_published_test_key,
    key_id_for,
    load_private_key,
    load_trusted_keys,
    published_test_key_id,
    refuse_published_test_key,
)
from connector.errors import CatalogError
from tests.support.catalogs import TEST_KEY
from tests.support.paths import SHIPPED_TRUST


def test_generate_writes_named_pair_with_private_mode_0600(tmp_path: Path) -> None:
    key_id = generate_key_pair(tmp_path / "out")
    public_path = tmp_path / "out" / f"{key_id}.pub"
    private_path = tmp_path / "out" / f"{key_id}.key"
    assert stat.S_IMODE(private_path.stat().st_mode) == 0o600
    public_text = public_path.read_text(encoding="ascii")
    assert public_text.endswith("\n") and "=" not in public_text
    raw_public = base64.urlsafe_b64decode(public_text.strip() + "=")
    assert len(raw_public) == 32
    assert key_id == hashlib.sha256(raw_public).hexdigest()[:16]


def test_private_key_matches_its_public_half(tmp_path: Path) -> None:
    key_id = generate_key_pair(tmp_path)
    private_key = load_private_key(tmp_path / f"{key_id}.key")
    trusted = load_trusted_keys(tmp_path)
    assert key_id_for(private_key.public_key()) == key_id
    trusted[key_id].verify(private_key.sign(b"payload"), b"payload")


def test_two_key_pairs_have_distinct_ids(tmp_path: Path) -> None:
    first, second = generate_key_pair(tmp_path), generate_key_pair(tmp_path)
    assert first != second
    assert set(load_trusted_keys(tmp_path)) == {first, second}


def test_trust_dir_ignores_other_files(tmp_path: Path) -> None:
    key_id = generate_key_pair(tmp_path)
    (tmp_path / "README.md").write_text("not a key\n", encoding="utf-8")
    assert list(load_trusted_keys(tmp_path)) == [key_id]


def test_refuses_a_public_key_file_not_named_after_its_key_id(tmp_path: Path) -> None:
    key_id = generate_key_pair(tmp_path)
    (tmp_path / f"{key_id}.pub").rename(tmp_path / "0000000000000000.pub")
    with pytest.raises(CatalogError) as refused:
        load_trusted_keys(tmp_path)
    assert refused.value.code == "catalog-trust-invalid"
    assert "0000000000000000.pub" in refused.value.message


@pytest.mark.parametrize(
    "content",
    [
        "not base64 at all!",
        b64url_encode(bytes(31)),
        b64url_encode(bytes(33)),
        b64url_encode(bytes(32)) + "=",
        base64.b64encode(bytes(range(200, 232))).decode(),
        "",
    ],
    ids=["garbage", "short", "long", "padded", "standard-alphabet", "empty"],
)
def test_refuses_a_public_key_file_that_is_not_32_raw_bytes(tmp_path: Path, content: str) -> None:
    (tmp_path / "0123456789abcdef.pub").write_text(content + "\n", encoding="ascii")
    with pytest.raises(CatalogError) as refused:
        load_trusted_keys(tmp_path)
    assert refused.value.code == "catalog-trust-invalid"
    if content:
        assert content not in refused.value.message


def test_refuses_a_missing_trust_dir(tmp_path: Path) -> None:
    with pytest.raises(CatalogError) as refused:
        load_trusted_keys(tmp_path / "absent")
    assert refused.value.code == "catalog-trust-invalid"


def test_empty_trust_dir_trusts_nothing(tmp_path: Path) -> None:
    assert dict(load_trusted_keys(tmp_path)) == {}


def test_refuses_an_invalid_private_key_file(tmp_path: Path) -> None:
    path = tmp_path / "operator.key"
    path.write_text("AAAA\n", encoding="ascii")
    with pytest.raises(CatalogError) as refused:
        load_private_key(path)
    assert refused.value.code == "catalog-key-invalid"
    with pytest.raises(CatalogError) as missing:
        load_private_key(tmp_path / "absent.key")
    assert missing.value.code == "catalog-key-invalid"


def test_b64url_decode_accepts_only_canonical_text() -> None:
    raw = bytes(range(64))
    text = b64url_encode(raw)
    assert b64url_decode(text, 64) == raw
    assert b64url_decode(text, 32) is None
    assert b64url_decode(text[:-1] + "B", 64) is None  # non-zero padding bits
    assert b64url_decode(text + "==", 64) is None
    assert b64url_decode("@@@@", 3) is None


def test_the_published_test_key_is_the_public_half_of_tests_keys() -> None:
    private_key = load_private_key(TEST_KEY)
    public_raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert b64url_encode(public_raw) == PUBLISHED_TEST_KEY
    assert published_test_key_id() == key_id_for(private_key.public_key()) == TEST_KEY.stem
    assert set(load_trusted_keys(SHIPPED_TRUST)) == {published_test_key_id()}


def test_a_trust_directory_holding_the_test_key_is_refused(tmp_path: Path) -> None:
    assert holds_published_test_key(SHIPPED_TRUST)
    with pytest.raises(CatalogError) as refused:
        refuse_published_test_key(SHIPPED_TRUST)
    assert refused.value.code == "catalog-test-key" and "--allow-test-key" in refused.value.message
    own = tmp_path / "trust"
    generate_key_pair(own)
    (own / "notes.txt").write_text(PUBLISHED_TEST_KEY, encoding="ascii")  # not a `.pub`: not trusted
    assert not holds_published_test_key(own)
    refuse_published_test_key(own)
    shutil.copy(SHIPPED_TRUST / f"{TEST_KEY.stem}.pub", own)
    assert holds_published_test_key(own)
    assert not holds_published_test_key(tmp_path / "missing")
