"""Which catalog a command reads: the one named, `catalog/actions.json` here, or the packaged example."""

from __future__ import annotations

import sys
from pathlib import Path

from connector.catalog.keys import published_test_key_id
from connector.catalog.signing import VerifiedCatalog
from connector.resources import example_catalog, example_trust

CHECKOUT_CATALOG = Path("catalog/actions.json")
CHECKOUT_TRUST = Path("catalog/trust")


def catalog_with_fallback(command: str, catalog: Path | None, trust: Path | None) -> tuple[Path, Path]:
    """(catalog, trust dir) for `scan` and `fixtures record`.

    Without `--catalog` and without `catalog/actions.json` in the working directory, the packaged example
    catalog is used (said so on stderr) with its packaged trust key; that key never vouches for a catalog
    the user named.
    """
    if catalog is not None:
        return catalog, trust or CHECKOUT_TRUST
    if CHECKOUT_CATALOG.is_file():
        return CHECKOUT_CATALOG, trust or CHECKOUT_TRUST
    print(
        f"sensorium-connector: {command}: no {CHECKOUT_CATALOG} here; using the packaged example catalog",
        file=sys.stderr,
    )
    return example_catalog(), trust or example_trust()



def test_key_note(command: str, catalog: VerifiedCatalog) -> str | None:
    """The stderr line saying that the accepted catalog is signed by the published test key (CONTRACT §12)."""
    if catalog.key_id != published_test_key_id():
        return None
    return (
        f"sensorium-connector: {command}: catalog signed by the published test key {catalog.key_id} "
        "(anyone can sign with it): for tests and demos only"
    )
