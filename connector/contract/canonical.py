"""Canonical bytes (RFC 8785) and digests over them."""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785


def canonical_bytes(document: Any) -> bytes:
    """RFC 8785 canonical UTF-8 bytes of a JSON value."""
    return rfc8785.dumps(document)


def sha256_hex(document: Any) -> str:
    """SHA-256 hex digest over the canonical bytes of a JSON value."""
    return hashlib.sha256(canonical_bytes(document)).hexdigest()
