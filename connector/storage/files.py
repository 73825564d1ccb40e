"""Private directories: everything the connector creates under its data dir is 0700 (files are 0600)."""

from __future__ import annotations

import os
from pathlib import Path

PRIVATE_DIR_MODE = 0o700


def make_private_dir(path: Path) -> None:
    """Create `path` and each missing parent 0700 (`mkdir(parents=True)` gives parents the umask default).

    Directories that already exist are left as they are: they are not the connector's to change.
    """
    missing: list[Path] = []
    current = Path(path)
    while not current.exists():
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # created meanwhile by another process
        os.chmod(directory, PRIVATE_DIR_MODE)  # exact, whatever the umask
