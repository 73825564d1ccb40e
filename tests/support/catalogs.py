"""Signed test catalogs: the shipped example plus extra actions, signed by the test key or a fresh one."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from connector.catalog.keys import generate_key_pair, load_private_key
from connector.catalog.signing import sign_catalog
from tests.support.paths import SHIPPED_CATALOG, TEST_KEYS

TEST_KEY = TEST_KEYS / "26d160dae106b7bb.key"  # its public half is in SHIPPED_TRUST


def example_catalog() -> dict[str, Any]:
    """A fresh copy of the shipped example catalog document."""
    document: dict[str, Any] = json.loads(SHIPPED_CATALOG.read_text(encoding="utf-8"))
    return copy.deepcopy(document)


def command_action(
    action_id: str,
    argv: Sequence[str],
    *,
    cancel: str = "terminate",
    support: str = "async-only",
    ttl_seconds: int = 300,
    timeout_ms: int = 60000,
) -> dict[str, Any]:
    """A catalog entry for a command action with no input and a retry hint of 1 s."""
    return {
        "action_id": action_id,
        "class": "command",
        "execution_mode_support": support,
        "deferred_profile": {"preferred_max_ttl_seconds": ttl_seconds, "retry_after_seconds": 1},
        "command": {"argv": list(argv), "timeout_ms": timeout_ms, "cancel": cancel, "input": "none"},
    }


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
    catalog_path: Path, document: Mapping[str, Any], private_key: Ed25519PrivateKey
) -> dict[str, Any]:
    """Write `document` and its detached signature beside it; answer the signature document."""
    signature = sign_catalog(dict(document), private_key)
    catalog_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    catalog_path.with_name(catalog_path.name + ".sig").write_text(
        json.dumps(signature) + "\n", encoding="utf-8"
    )
    return signature


def signed_catalog(
    directory: Path,
    extra_actions: Iterable[Mapping[str, Any]] = (),
    *,
    document: Mapping[str, Any] | None = None,
    private_key: Ed25519PrivateKey | None = None,
) -> Path:
    """`directory/actions.json`: the example catalog (or `document`) plus `extra_actions`, signed.

    Signed by the test key (trusted by the shipped trust dir) unless another `private_key` is given.
    """
    body = copy.deepcopy(dict(document)) if document is not None else example_catalog()
    body["actions"] = [*body["actions"], *(dict(action) for action in extra_actions)]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "actions.json"
    write_signed(path, body, private_key or load_private_key(TEST_KEY))
    return path
