"""Operator Ed25519 keys on disk: `<key/id>.pub` and `<key/id>.key`, raw 32 bytes in base64url (CONTRACT
§12)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from connector.errors import CatalogError, Code

RAW_KEY_BYTES = 32
PUBLIC_SUFFIX = ".pub"
PRIVATE_SUFFIX = ".key"
TRUST_INVALID = Code.CATALOG_TRUST_INVALID
KEY_INVALID = Code.CATALOG_KEY_INVALID
TEST_KEY_TRUSTED = Code.CATALOG_TEST_KEY
# The public half of the test key whose private half is published in `tests/keys/` (CONTRACT §12): it signs
# the example catalog, so trusting it is trusting anyone who can write a catalog file.
PUBLISHED_TEST_KEY = "bUF2alQYYRx8POMeUOJqqqeXqlk3kMjNh0f2JHtYcTo"


def b64url_encode(raw: bytes) -> str:
    """Unpadded base64url text of `raw`."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str, expected_length: int) -> bytes | None:
    """The bytes of canonical unpadded base64url text of the expected length, else None."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if len(raw) != expected_length or b64url_encode(raw) != text:
        return None
    return raw


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    """The raw 32-byte encoding of a public key."""
    return public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)


def key_id_for(public_key: Ed25519PublicKey) -> str:
    """`key/id`: the first 16 hex characters of SHA-256 over the raw public key."""
    return hashlib.sha256(raw_public_bytes(public_key)).hexdigest()[:16]


def generate_key_pair(out_dir: Path) -> str:
    """Write a fresh key pair into `out_dir` (private half mode 0600) and return its key id."""
    private_key = Ed25519PrivateKey.generate()
    public_key = private_key.public_key()
    key_id = key_id_for(public_key)
    out_dir.mkdir(parents=True, exist_ok=True)
    private_raw = private_key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    _write_new_file(out_dir / f"{key_id}{PRIVATE_SUFFIX}", b64url_encode(private_raw), 0o600)
    _write_new_file(out_dir / f"{key_id}{PUBLIC_SUFFIX}", b64url_encode(raw_public_bytes(public_key)), 0o644)
    return key_id


def _write_new_file(path: Path, text: str, mode: int) -> None:
    """Create `path` exclusively with `mode` from the start, so a secret is never briefly world-readable."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(text + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def _read_key_text(path: Path, code: str) -> bytes:
    """The raw key bytes of one key file; refuse anything but 32 bytes of base64url."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as error:
        raise CatalogError(f"cannot read key file {path.name}", code=code) from error
    raw = b64url_decode(text, RAW_KEY_BYTES)
    if raw is None:
        raise CatalogError(f"key file {path.name} is not a raw 32-byte key in base64url", code=code)
    return raw


def load_public_key(path: Path) -> Ed25519PublicKey:
    """One `<key/id>.pub` file; its name must match the key id of its contents."""
    public_key = Ed25519PublicKey.from_public_bytes(_read_key_text(path, TRUST_INVALID))
    if path.name != f"{key_id_for(public_key)}{PUBLIC_SUFFIX}":
        raise CatalogError(f"trusted key file {path.name} is not named after its key id", code=TRUST_INVALID)
    return public_key


def load_trusted_keys(trust_dir: Path) -> Mapping[str, Ed25519PublicKey]:
    """Every `*.pub` key in `trust_dir`, by key id; other files are ignored."""
    if not trust_dir.is_dir():
        raise CatalogError(f"trust directory {trust_dir} does not exist", code=TRUST_INVALID)
    keys: dict[str, Ed25519PublicKey] = {}
    for path in sorted(trust_dir.glob(f"*{PUBLIC_SUFFIX}")):
        public_key = load_public_key(path)
        keys[key_id_for(public_key)] = public_key
    return MappingProxyType(keys)


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """One `<key/id>.key` file."""
    return Ed25519PrivateKey.from_private_bytes(_read_key_text(path, KEY_INVALID))


def published_test_key_id() -> str:
    """The key id of the published test key."""
    raw = b64url_decode(PUBLISHED_TEST_KEY, RAW_KEY_BYTES)
    assert raw is not None  # a constant of this module
    return hashlib.sha256(raw).hexdigest()[:16]


def holds_published_test_key(trust_dir: Path) -> bool:
    """Whether a `*.pub` file in `trust_dir` is the published test key (files that are no key are not)."""
    for path in sorted(trust_dir.glob(f"*{PUBLIC_SUFFIX}")) if trust_dir.is_dir() else ():
        try:
            text = path.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue  # loading the trust directory refuses it with its own reason
        if text == PUBLISHED_TEST_KEY:
            return True
    return False


def refuse_published_test_key(trust_dir: Path) -> None:
    """`catalog-test-key` when `trust_dir` trusts the published test key (CONTRACT §12)."""
    if holds_published_test_key(trust_dir):
        raise CatalogError(
            f"trust directory {trust_dir} holds the published test key {published_test_key_id()}, whose "
            "private half anyone can read; trust your own operator key, or pass --allow-test-key for tests "
            "and demos",
            code=TEST_KEY_TRUSTED,
        )
