"""Signing and the catalog models stay pure: importing them loads no I/O or async library."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.paths import REPO

FORBIDDEN = ("anyio", "asyncio", "bleak", "serial", "zeroconf", "aiosqlite", "sqlite3", "fastapi", "nats")


@pytest.mark.realtime  # a fresh interpreter
def test_signing_imports_no_io_library() -> None:
    probe = (
        "import sys; import connector.catalog.signing, connector.contract.catalog_models; "
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert completed.stdout.strip() == ""
