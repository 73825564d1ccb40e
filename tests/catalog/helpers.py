"""Shared builders for the catalog tests: fresh keys, catalogs and signed files on disk."""

from __future__ import annotations

import copy
import json
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from connector.catalog.keys import generate_key_pair, load_private_key
from connector.catalog.signing import sign_catalog

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIPPED_CATALOG = REPO_ROOT / "catalog" / "actions.json"
SHIPPED_TRUST = REPO_ROOT / "catalog" / "trust"
TEST_KEYS = REPO_ROOT / "tests" / "keys"
# Inside the shipped catalog's validity window.
NOW = datetime(2027, 1, 1, tzinfo=UTC)
CANARY = "CANARY-7f3e9b21-do-not-echo"


def example_catalog() -> dict[str, Any]:
    """A fresh copy of the shipped example catalog document."""
    document: dict[str, Any] = json.loads(SHIPPED_CATALOG.read_text(encoding="utf-8"))
    return copy.deepcopy(document)


def new_key(directory: Path) -> tuple[str, Ed25519PrivateKey]:
    """Generate a key pair into `directory`; answer its id and private key."""
    key_id = generate_key_pair(directory)
    return key_id, load_private_key(directory / f"{key_id}.key")


@dataclass(frozen=True)
class Operator:
    """A generated key pair and a trust dir that trusts it."""

    key_id: str
    private_key: Ed25519PrivateKey
    key_path: Path
    trust_dir: Path


def new_operator(base: Path) -> Operator:
    """A fresh key pair under `base/keys`, its public half copied into `base/trust`."""
    key_id, private_key = new_key(base / "keys")
    trust_dir = base / "trust"
    trust_dir.mkdir(parents=True)
    shutil.copy(base / "keys" / f"{key_id}.pub", trust_dir / f"{key_id}.pub")
    return Operator(key_id, private_key, base / "keys" / f"{key_id}.key", trust_dir)


def write_signed(
    catalog_path: Path, document: dict[str, Any], private_key: Ed25519PrivateKey
) -> dict[str, Any]:
    """Write `document` and its detached signature beside it; answer the signature document."""
    signature = sign_catalog(document, private_key)
    catalog_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    catalog_path.with_name(catalog_path.name + ".sig").write_text(
        json.dumps(signature) + "\n", encoding="utf-8"
    )
    return signature


def error_text(error: BaseException) -> str:
    """Everything a refusal could show anyone: its string, message and diagnostics."""
    message = getattr(error, "message", "")
    diagnostics = getattr(error, "diagnostics", ())
    return f"{error!s} {message} {diagnostics!r} {error!r}"
