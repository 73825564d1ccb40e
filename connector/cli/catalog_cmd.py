"""`catalog keygen | sign | verify`: operator keys, detached signatures, and verification."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from connector.catalog.keys import (
    PRIVATE_SUFFIX,
    PUBLIC_SUFFIX,
    RAW_KEY_BYTES,
    b64url_decode,
    generate_key_pair,
    key_id_for,
    load_private_key,
)
from connector.catalog.loader import MISSING, load_verified_catalog, read_json_document, signature_path_for
from connector.catalog.signing import sign_catalog
from connector.cli.catalog_source import test_key_note
from connector.cli.main import EXIT_FAILED, EXIT_OK, usage_error
from connector.errors import CatalogError

DEFAULT_TRUST_DIR = Path("catalog/trust")


def register(subparsers: Any) -> None:
    """Add `catalog` with its three subcommands."""
    parser = subparsers.add_parser("catalog", help="operator keys, catalog signatures, verification")
    commands = parser.add_subparsers(dest="catalog_command", required=True)
    keygen = commands.add_parser("keygen", help="create an Ed25519 operator key pair; prints its key id")
    keygen.add_argument("--out", type=Path, required=True, metavar="DIR")
    keygen.set_defaults(handler=run_keygen)
    sign = commands.add_parser("sign", help="write the detached signature CATALOG.sig")
    sign.add_argument("catalog", type=Path, metavar="CATALOG")
    sign.add_argument("--key", type=Path, required=True, metavar="KEY")
    sign.set_defaults(handler=run_sign)
    verify = commands.add_parser("verify", help="verify CATALOG with CATALOG.sig against trusted keys")
    verify.add_argument("catalog", type=Path, metavar="CATALOG")
    verify.add_argument("--trust", type=Path, default=DEFAULT_TRUST_DIR, metavar="DIR")
    verify.add_argument("--data-dir", type=Path, default=None, metavar="D")
    verify.set_defaults(handler=run_verify)


def run_keygen(args: argparse.Namespace) -> int:
    """Write `<key/id>.pub` and `<key/id>.key` into `--out` and print the key id."""
    out_dir: Path = args.out
    if out_dir.exists() and not out_dir.is_dir():
        return usage_error(f"{out_dir} is not a directory")
    try:
        key_id = generate_key_pair(out_dir)
    except OSError:
        return usage_error(f"cannot write a key pair into {out_dir}")
    print(key_id)
    return EXIT_OK


def run_sign(args: argparse.Namespace) -> int:
    """Sign CATALOG with the private key and write CATALOG.sig."""
    catalog_path: Path = args.catalog
    for path in (catalog_path, args.key):
        if not path.is_file():
            return usage_error(f"{path} does not exist")
    refusal = public_key_refusal(args.key)
    if refusal is not None:
        return usage_error(f"cannot sign: {refusal}")
    try:
        private_key = load_private_key(args.key)
        catalog_doc = read_json_document(catalog_path, missing_code=MISSING)
        signature_doc = sign_catalog(catalog_doc, private_key)
    except CatalogError as error:
        return usage_error(f"cannot sign: {error.code}: {error.message}")
    signature_path = signature_path_for(catalog_path)
    signature_path.write_text(json.dumps(signature_doc, indent=2) + "\n", encoding="utf-8")
    print(f"signed with key {signature_doc['key/id']}: {signature_path}")
    return EXIT_OK


def public_key_refusal(path: Path) -> str | None:
    """Why `path` is the public half of a key pair (signing needs `<key/id>.key`), else None."""
    if path.name.endswith(PUBLIC_SUFFIX):
        return f"{path.name} is a public key; sign with the private key {path.stem}{PRIVATE_SUFFIX}"
    try:
        raw = b64url_decode(path.read_text(encoding="ascii").strip(), RAW_KEY_BYTES)
    except (OSError, UnicodeDecodeError):
        return None
    if raw is None:
        return None
    # The same 32 bytes read as a public key whose id names the file: it is the public half, renamed.
    try:
        as_public = Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        return None
    if path.stem == key_id_for(as_public):
        return f"{path.name} holds the public key {path.stem}; sign with its private key"
    return None


def run_verify(args: argparse.Namespace) -> int:
    """Exit 0 with a summary when CATALOG verifies, 1 with the reason when it is refused."""
    if not args.catalog.is_file():
        return usage_error(f"{args.catalog} does not exist")
    if not args.trust.is_dir():
        return usage_error(f"trust directory {args.trust} does not exist")
    if args.data_dir is not None and args.data_dir.exists() and not args.data_dir.is_dir():
        return usage_error(f"{args.data_dir} is not a directory")
    try:
        verified = load_verified_catalog(
            args.catalog, trust_dir=args.trust, data_dir=args.data_dir, now=datetime.now(UTC)
        )
    except CatalogError as error:
        print(f"sensorium-connector: catalog refused: {error.code}: {error.message}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"catalog {verified.catalog_id} version {verified.version} verified: "
        f"{len(verified.actions)} actions, signed by key {verified.key_id}"
    )
    note = test_key_note("catalog verify", verified)
    if note is not None:
        print(note, file=sys.stderr)
    return EXIT_OK
