"""Package data: inside an installed wheel it sits in `connector/_data/`; in a checkout, at the repo root.

The wheel's build copies `schemas/` and the example `catalog/` (catalog, signature, public trust keys) into
`connector/_data/` (see `setup.py`), so one tree is the source of both.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

DISTRIBUTION = "sensorium-os-connector"
_PACKAGE = Path(__file__).resolve().parent
PACKAGED_DATA = _PACKAGE / "_data"
_CHECKOUT = _PACKAGE.parent


def data_dir(name: str) -> Path:
    """The folder `name` (`schemas` or `catalog`) of the package data, packaged copy first."""
    packaged = PACKAGED_DATA / name
    return packaged if packaged.is_dir() else _CHECKOUT / name


def example_catalog() -> Path:
    """The example signed catalog shipped with the package."""
    return data_dir("catalog") / "actions.json"


def example_trust() -> Path:
    """The trusted operator keys of the example catalog (used only with that catalog)."""
    return data_dir("catalog") / "trust"


def version() -> str:
    """The installed distribution's version."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:  # a bare checkout on sys.path, never installed
        return "0+unknown"
