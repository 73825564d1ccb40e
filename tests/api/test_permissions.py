"""Issue D9: every directory the connector creates is 0700 and every file 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from connector.storage.files import make_private_dir
from tests.api.support import RecordingFactory, harness, straps
from tests.support.directives import scan_directive


def modes(root: Path) -> dict[str, int]:
    """Permission bits of `root` and everything under it, by relative path."""
    found = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        found[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return found


def test_missing_parents_are_created_private_too(tmp_path: Path) -> None:
    (tmp_path / "shared").mkdir(mode=0o755)
    os.chmod(tmp_path / "shared", 0o755)
    old = os.umask(0o022)
    try:
        make_private_dir(tmp_path / "shared" / "a" / "b" / "c")
        make_private_dir(tmp_path / "a" / "b" / "c")
        make_private_dir(tmp_path / "a" / "b" / "c")  # idempotent
    finally:
        os.umask(old)
    assert modes(tmp_path / "a") == {".": 0o700, "b": 0o700, "b/c": 0o700}
    assert stat.S_IMODE((tmp_path / "shared").stat().st_mode) == 0o755  # not the connector's to change
    assert modes(tmp_path / "shared" / "a")["b/c"] == 0o700


@pytest.mark.asyncio
async def test_a_data_dir_the_connector_creates_is_private_throughout(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        factory = RecordingFactory(straps(1), concurrent=True)
        async with harness(tmp_path, factory=factory) as h:
            accepted = await h.invoke("alice", scan_directive(1))
            await h.poll("alice", accepted.headers["location"])
            found = modes(h.data_dir)
    finally:
        os.umask(old)
    assert {"modules", "modules/sensorium-os", "storage", "principals.json"} <= set(found)
    for name, mode in found.items():
        is_dir = (h.data_dir / name).is_dir()
        assert mode == (0o700 if is_dir else 0o600), (name, oct(mode))
