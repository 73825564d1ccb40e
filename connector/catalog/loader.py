"""Load `CATALOG` and `CATALOG.sig` from disk, verify them, and raise the rollback floor on acceptance."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from connector.catalog.keys import load_trusted_keys
from connector.catalog.signing import MALFORMED, VerifiedCatalog, verify_catalog
from connector.catalog.state import highest_recorded_version, record_accepted_version
from connector.errors import CatalogError, Code

SIGNATURE_SUFFIX = ".sig"
# Far above 64 actions of bounded strings; a larger file is not a catalog.
MAX_FILE_BYTES = 1024 * 1024
MISSING = Code.CATALOG_MISSING
UNSIGNED = Code.CATALOG_UNSIGNED
UNREADABLE = Code.CATALOG_UNREADABLE


def signature_path_for(catalog_path: Path) -> Path:
    """`CATALOG.sig` beside `CATALOG`."""
    return catalog_path.with_name(catalog_path.name + SIGNATURE_SUFFIX)


def load_verified_catalog(
    catalog_path: Path, *, trust_dir: Path, data_dir: Path | None, now: datetime
) -> VerifiedCatalog:
    """The verified catalog at `catalog_path`; records its version under `data_dir` when given."""
    catalog_doc = read_json_document(catalog_path, missing_code=MISSING)
    signature_doc = read_json_document(signature_path_for(catalog_path), missing_code=UNSIGNED)
    trusted_keys = load_trusted_keys(trust_dir)
    floor = None if data_dir is None else highest_recorded_version(data_dir)
    verified = verify_catalog(
        catalog_doc, signature_doc, trusted_keys, now=now, highest_accepted_version=floor
    )
    if data_dir is not None:
        record_accepted_version(data_dir, verified.catalog_id, verified.version)
    return verified


def read_json_document(path: Path, *, missing_code: str) -> Any:
    """One strict JSON document (UTF-8, no duplicate keys, no NaN) or a `CatalogError`."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise CatalogError(f"{path} does not exist", code=missing_code) from None
    except OSError:
        raise CatalogError(f"cannot read {path}", code=UNREADABLE) from None
    if len(data) > MAX_FILE_BYTES:
        raise CatalogError(f"{path} is larger than {MAX_FILE_BYTES} bytes", code=MALFORMED)
    try:
        return json.loads(data.decode("utf-8"), object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        # JSON errors quote document text; report the file only.
        raise CatalogError(f"{path} is not a well-formed JSON document", code=MALFORMED) from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose keys are all distinct (RFC 8785 has no answer for duplicates)."""
    document = dict(pairs)
    if len(document) != len(pairs):
        raise ValueError("duplicate key")
    return document


def _no_constant(_: str) -> NoReturn:
    """NaN and Infinity are not JSON."""
    raise ValueError("non-standard constant")

