"""The rollback floor: `<data-dir>/catalog-state.json` keeps the highest accepted version per `catalog/id`.

The floor itself is global (CONTRACT §12: "the highest recorded"): a catalog is refused when its version is
lower than the highest version recorded for ANY catalog id, so that a fresh id cannot reset the floor.
A state file that cannot be read as such refuses every catalog (`catalog-state-invalid`) rather than
silently forgetting the floor.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType

from connector.errors import CatalogError, Code
from connector.storage.files import make_private_dir

STATE_FILE = "catalog-state.json"
LOCK_FILE = "catalog-state.lock"
STATE_SCHEMA = "sensorium-catalog-state.v1"
STATE_INVALID = Code.CATALOG_STATE_INVALID


def read_accepted_versions(data_dir: Path) -> Mapping[str, int]:
    """The highest accepted version by catalog id (empty when nothing was recorded yet)."""
    path = data_dir / STATE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return MappingProxyType({})
    except (OSError, UnicodeDecodeError) as error:
        raise CatalogError(f"cannot read {path}", code=STATE_INVALID) from error
    return MappingProxyType(_parse_state(text, path))


def highest_accepted_version(data_dir: Path, catalog_id: str) -> int | None:
    """The highest version of `catalog_id` accepted so far, if any."""
    return read_accepted_versions(data_dir).get(catalog_id)


def highest_recorded_version(data_dir: Path) -> int | None:
    """The rollback floor: the highest version recorded for any catalog id, if any."""
    return max(read_accepted_versions(data_dir).values(), default=None)


def record_accepted_version(data_dir: Path, catalog_id: str, version: int) -> int:
    """Raise the floor of `catalog_id` to `version` (never lower it); answer the floor now recorded."""
    make_private_dir(data_dir)
    with _locked(data_dir):
        versions = dict(read_accepted_versions(data_dir))
        floor = max(version, versions.get(catalog_id, version))
        if versions.get(catalog_id) != floor:
            versions[catalog_id] = floor
            _write_atomically(data_dir / STATE_FILE, _render_state(versions))
    return floor


def _parse_state(text: str, path: Path) -> dict[str, int]:
    """Versions from the state file text, or `catalog-state-invalid`."""
    try:
        document = json.loads(text)
    except ValueError:
        raise CatalogError(f"{path} is not JSON", code=STATE_INVALID) from None
    if not isinstance(document, dict) or document.get("schema") != STATE_SCHEMA:
        raise CatalogError(f"{path} is not a {STATE_SCHEMA} document", code=STATE_INVALID)
    catalogs = document.get("catalogs")
    if not isinstance(catalogs, dict):
        raise CatalogError(f"{path} is not a {STATE_SCHEMA} document", code=STATE_INVALID)
    versions: dict[str, int] = {}
    for catalog_id, entry in catalogs.items():
        version = entry.get("highest_accepted_version") if isinstance(entry, dict) else None
        if type(version) is not int or version < 1:
            raise CatalogError(f"{path} holds an invalid version", code=STATE_INVALID)
        versions[catalog_id] = version
    return versions


def _render_state(versions: Mapping[str, int]) -> str:
    """The state document, stable key order, trailing newline."""
    catalogs = {cid: {"highest_accepted_version": versions[cid]} for cid in sorted(versions)}
    return json.dumps({"schema": STATE_SCHEMA, "catalogs": catalogs}, indent=2) + "\n"


@contextmanager
def _locked(data_dir: Path) -> Iterator[None]:
    """Serialise read-modify-write between processes sharing a data dir."""
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_atomically(path: Path, text: str) -> None:
    """Temp file in the same directory, fsync, rename over, fsync the directory."""
    fd, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
